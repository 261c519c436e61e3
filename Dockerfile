# Sluice: one image for the broker, the simulator and standalone processors.
#   docker build -t sluice:local .       (docker compose builds it for you)
# `serve` defaults to authentication required and TLS on every listener (never an open broker on 0.0.0.0),
# with the certificate in the data volume; the first start needs a certificate and a first user:
#   docker run --rm -v sluice-data:/data sluice:local certs dev --data-dir /data --if-missing --host HOSTNAME
#   docker run --rm -it -v sluice-data:/data sluice:local users add admin --data-dir /data    # asks the password
#   docker run -p 127.0.0.1:9092:9092 -p 127.0.0.1:8883:8883 -p 127.0.0.1:8094:8094 -p 127.0.0.1:8080:8080 \
#       -v sluice-data:/data -e SLUICE_SECURITY__SUPER_USERS='["admin"]' \
#       -e SLUICE_KAFKA__ADVERTISED_HOST=localhost sluice:local serve
# SLUICE_KAFKA__ADVERTISED_HOST is required: the listeners bind 0.0.0.0, and Kafka clients must be told an
# address they can reach (serve refuses to start without it, as Kafka does).
# (docs/security.md "Quick secure setup"; clients trust /data/tls/ca.pem.)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SLUICE_DATA_DIR=/data \
    SLUICE_HOST=0.0.0.0 \
    SLUICE_SECURITY__AUTH=required \
    SLUICE_SECURITY__TLS_CERT=/data/tls/server.pem \
    SLUICE_SECURITY__TLS_KEY=/data/tls/server-key.pem

RUN useradd --create-home --uid 10001 sluice \
    && mkdir /data && chown sluice:sluice /data

WORKDIR /app
# Dependencies first, in their own layer: editing the code does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY README.md ./
COPY broker ./broker
COPY ingest ./ingest
COPY clients ./clients
COPY processors ./processors
COPY sluice ./sluice
# setup.py compiles native-modules.txt with mypyc (a C compiler only for this step; a failed build
# falls back to the pure-Python modules, see setup.py); the image keeps the built extensions.
COPY setup.py native-modules.txt ./
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null \
    && pip install --no-deps . && sluice --help >/dev/null \
    && apt-get purge -y -qq --auto-remove gcc libc6-dev >/dev/null && rm -rf /var/lib/apt/lists/*

USER sluice
VOLUME ["/data"]
# Kafka (host-facing), Kafka (compose network), MQTT, MQTT over TLS, TCP lines, HTTP(S)
EXPOSE 9092 29092 1883 8883 8094 8080

# Liveness for `sluice serve`: the HTTP API starts last, so an answer means every listener is up.
# (Services running `sluice simulate`/`process` from this image override or disable it.)
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=10 \
    CMD python -c "import os, ssl, urllib.request; tls = bool(os.environ.get('SLUICE_SECURITY__TLS_CERT')); urllib.request.urlopen(('https' if tls else 'http') + '://127.0.0.1:' + os.environ.get('SLUICE_HTTP__PORT', '8080') + '/health', timeout=2, context=ssl._create_unverified_context() if tls else None)"

# PID 1 is sluice itself: serve, simulate and process all stop cleanly on SIGTERM (docker stop).
STOPSIGNAL SIGTERM
ENTRYPOINT ["sluice"]
CMD ["serve"]
