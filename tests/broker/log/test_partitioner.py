from broker.log.partitioner import StickyPartitioner, murmur2, partition_for_key


def test_murmur2_matches_kafka_reference_values() -> None:
    # Values from Kafka's UtilsTest / kafka-python's test_partitioner.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"") == 275646681
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


def test_partition_for_key_is_positive_modulo() -> None:
    assert all(0 <= partition_for_key(str(i).encode(), 6) < 6 for i in range(1000))


def test_sticky_round_robin_covers_all_partitions() -> None:
    sticky = StickyPartitioner()
    assert {sticky.next_partition(4) for _ in range(8)} == {0, 1, 2, 3}
