/*
 * A librdkafka load generator for bench/bench_kafka.py: COUNT records of SIZE bytes to one
 * partition, as cheaply per record as librdkafka allows, so that on a 2-core machine the load
 * generator takes as little CPU from the broker as redis-benchmark takes from Redis.
 *
 * Cheaper than `kcat -P -l FILE` because it
 *   - enqueues 10,000 records per rd_kafka_produce_batch() call (one queue lock per call),
 *   - points every record at one static payload instead of reading and copying a line,
 *   - asks only for failed deliveries (delivery.report.only.error), not one report per record.
 * The records still go through librdkafka's own batching, idempotence and wire encoding.
 *
 * Usage: kafka_produce BOOTSTRAP TOPIC PARTITION COUNT SIZE [key=value ...]
 *   key=value pairs are librdkafka properties (acks=all, enable.idempotence=true, linger.ms=5 ...).
 * Prints one JSON line: {"enqueued": N, "failed": F, "seconds": S}; exits 1 on any failure.
 */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 10000
#define MAX_QUEUED 200000

static long failed_deliveries;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque) {
    (void)rk;
    (void)opaque;
    if (msg->err) {
        if (failed_deliveries++ == 0)
            fprintf(stderr, "delivery failed: %s\n", rd_kafka_err2str(msg->err));
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void set(rd_kafka_conf_t *conf, const char *key, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(conf, key, value, err, sizeof err) != RD_KAFKA_CONF_OK) {
        fprintf(stderr, "%s=%s: %s\n", key, value, err);
        exit(2);
    }
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s BOOTSTRAP TOPIC PARTITION COUNT SIZE [key=value ...]\n", argv[0]);
        return 2;
    }
    const char *topic_name = argv[2];
    int32_t partition = (int32_t)atoi(argv[3]);
    long count = atol(argv[4]);
    size_t size = (size_t)atol(argv[5]);

    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    set(conf, "bootstrap.servers", argv[1]);
    set(conf, "delivery.report.only.error", "true");
    /* Room for MAX_QUEUED + CHUNK records: enqueueing never fails for space. */
    set(conf, "queue.buffering.max.messages", "1000000");
    set(conf, "queue.buffering.max.kbytes", "1048576");
    for (int i = 6; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq == NULL) {
            fprintf(stderr, "expected key=value, got %s\n", argv[i]);
            return 2;
        }
        *eq = '\0';
        set(conf, argv[i], eq + 1);
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (rk == NULL) {
        fprintf(stderr, "rd_kafka_new: %s\n", err);
        return 1;
    }
    rd_kafka_topic_t *topic = rd_kafka_topic_new(rk, topic_name, NULL);

    char *payload = malloc(size);
    memset(payload, 'x', size);
    rd_kafka_message_t *chunk = calloc(CHUNK, sizeof *chunk);

    double started = now();
    long enqueued = 0;
    while (enqueued < count) {
        /* Keep at most MAX_QUEUED records in librdkafka's queue, so their memory is reused
         * rather than faulted in afresh for every record of the run. */
        while (rd_kafka_outq_len(rk) > MAX_QUEUED)
            rd_kafka_poll(rk, 1);
        int n = count - enqueued < CHUNK ? (int)(count - enqueued) : CHUNK;
        for (int i = 0; i < n; i++) {
            chunk[i].payload = payload; /* flags 0: librdkafka neither copies nor frees it */
            chunk[i].len = size;
            chunk[i].err = RD_KAFKA_RESP_ERR_NO_ERROR;
        }
        int accepted = rd_kafka_produce_batch(topic, partition, 0, chunk, n);
        if (accepted != n) {
            /* The records after the first refused one are not retried here: retrying them out of
             * order would break the per-partition order the benchmark's count check relies on. */
            for (int i = 0; i < n; i++) {
                if (chunk[i].err) {
                    fprintf(stderr, "enqueue failed: %s\n", rd_kafka_err2str(chunk[i].err));
                    break;
                }
            }
            return 1;
        }
        enqueued += n;
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_resp_err_t flushed = rd_kafka_flush(rk, 600 * 1000);
    double seconds = now() - started;
    printf("{\"enqueued\": %ld, \"failed\": %ld, \"seconds\": %.6f}\n", enqueued, failed_deliveries, seconds);
    rd_kafka_topic_destroy(topic);
    rd_kafka_destroy(rk);
    free(chunk);
    free(payload);
    if (flushed != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "flush: %s\n", rd_kafka_err2str(flushed));
        return 1;
    }
    return failed_deliveries ? 1 : 0;
}
