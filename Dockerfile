# Sluice: one image for the broker, the simulator and standalone processors.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SLUICE_DATA_DIR=/data \
    SLUICE_HOST=0.0.0.0

RUN useradd --create-home --uid 10001 sluice \
    && mkdir /data && chown sluice:sluice /data

WORKDIR /app
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY ingest ./ingest
COPY clients ./clients
COPY processors ./processors
COPY sluice ./sluice
RUN pip install .

USER sluice
VOLUME ["/data"]
# Kafka (host-facing), Kafka (compose network), MQTT, TCP lines, HTTP
EXPOSE 9092 29092 1883 8094 8080

HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=10 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('SLUICE_HTTP__PORT', '8080') + '/health', timeout=2)"

ENTRYPOINT ["sluice"]
CMD ["serve"]
