"""The coordinator's rules (broker/txn/machine.py header), case by case, without I/O."""

from __future__ import annotations

import itertools

from broker.protocol.kafka_codes import ErrorCode
from broker.txn import machine
from broker.txn.metadata import TxnMetadata, TxnState

MAX_TIMEOUT = 900_000
_ids = itertools.count(1000)


def _init(current: TxnMetadata | None, expected: tuple[int, int] | None = None,
          timeout: int = 60_000) -> ErrorCode | TxnMetadata | machine.EndPlan:
    return machine.init_producer_id(current, "t", timeout, expected, 1, lambda: next(_ids), MAX_TIMEOUT)


def _fresh() -> TxnMetadata:
    md = _init(None)
    assert isinstance(md, TxnMetadata)
    return md


def _ongoing() -> TxnMetadata:
    md = _fresh()
    added = machine.add_partitions(md, md.producer_id, md.producer_epoch, {("a", 0): 5}, 10)
    assert isinstance(added, TxnMetadata)
    return added


def test_rule_1_new_id_then_epoch_bumps_fence_older_instances() -> None:
    md = _fresh()
    assert (md.state, md.producer_epoch) == (TxnState.EMPTY, 0)
    again = _init(md)
    assert isinstance(again, TxnMetadata)
    assert (again.producer_id, again.producer_epoch) == (md.producer_id, 1)


def test_rule_1_timeouts_bounded_and_empty_id_refused() -> None:
    assert _init(None, timeout=MAX_TIMEOUT + 1) == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert _init(None, timeout=0) == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert machine.init_producer_id(None, "", 1000, None, 1, lambda: 1, MAX_TIMEOUT) == ErrorCode.INVALID_REQUEST


def test_rule_1_exhausted_epoch_rotates_the_producer_id() -> None:
    md = _fresh().evolve(producer_epoch=machine.MAX_EPOCH - 1)
    rotated = _init(md)
    assert isinstance(rotated, TxnMetadata)
    assert rotated.producer_id != md.producer_id and rotated.producer_epoch == 0
    assert rotated.last_producer_id == md.producer_id


def test_rule_1_open_transaction_is_aborted_with_a_bumped_epoch() -> None:
    md = _ongoing()
    plan = _init(md)
    assert isinstance(plan, machine.EndPlan)
    assert not plan.commit and plan.fenced and plan.prepare.producer_epoch == md.producer_epoch + 1
    assert plan.prepare.state == TxnState.PREPARE_ABORT and plan.complete.partitions == {}


def test_rule_1_kip_360_expected_producer() -> None:
    md = _fresh()
    assert _init(md, expected=(md.producer_id + 1, 0)) == ErrorCode.PRODUCER_FENCED
    assert _init(md, expected=(md.producer_id, 5)) == ErrorCode.PRODUCER_FENCED
    bumped = _init(md, expected=(md.producer_id, md.producer_epoch))
    assert isinstance(bumped, TxnMetadata) and bumped.producer_epoch == 1


def test_rule_2_wrong_producer_or_epoch() -> None:
    md = _fresh()
    assert machine.add_partitions(None, 1, 0, {("a", 0): 0}, 1) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert machine.add_partitions(md, md.producer_id + 1, 0, {("a", 0): 0}, 1) == \
        ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert machine.end_txn(md, md.producer_id, md.producer_epoch + 1, True, 1) == ErrorCode.PRODUCER_FENCED


def test_rule_3_adding_twice_changes_nothing_and_keeps_the_first_bound() -> None:
    md = _ongoing()
    assert machine.add_partitions(md, md.producer_id, md.producer_epoch, {("a", 0): 99}, 20) is None
    more = machine.add_partitions(md, md.producer_id, md.producer_epoch, {("a", 0): 99, ("b", 1): 7}, 20)
    assert isinstance(more, TxnMetadata)
    assert more.partitions == {("a", 0): 5, ("b", 1): 7} and more.start_ms == md.start_ms


def test_rule_4_offsets_need_the_group_in_the_transaction() -> None:
    md = _ongoing()
    assert machine.txn_offset_commit(md, md.producer_id, md.producer_epoch, "g", {("a", 0): (3, None)}, 1) == \
        ErrorCode.INVALID_TXN_STATE
    with_group = machine.add_group(md, md.producer_id, md.producer_epoch, "g", 2)
    assert isinstance(with_group, TxnMetadata)
    committed = machine.txn_offset_commit(with_group, md.producer_id, md.producer_epoch, "g", {("a", 0): (3, "m")}, 3)
    assert isinstance(committed, TxnMetadata) and committed.pending_offsets == {"g": {("a", 0): (3, "m")}}


def test_rule_5_end_transitions_and_retries() -> None:
    md = _ongoing()
    plan = machine.end_txn(md, md.producer_id, md.producer_epoch, True, 30)
    assert isinstance(plan, machine.EndPlan) and plan.commit
    done = plan.complete
    assert done.state == TxnState.COMPLETE_COMMIT
    assert machine.end_txn(done, md.producer_id, md.producer_epoch, True, 31) == ErrorCode.NONE
    assert machine.end_txn(done, md.producer_id, md.producer_epoch, False, 31) == ErrorCode.INVALID_TXN_STATE
    assert machine.end_txn(plan.prepare, md.producer_id, md.producer_epoch, True, 31) == \
        ErrorCode.CONCURRENT_TRANSACTIONS
    assert machine.end_txn(_fresh(), 1000, 0, True, 1) in (ErrorCode.INVALID_TXN_STATE,
                                                           ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    empty = _fresh()
    assert machine.end_txn(empty, empty.producer_id, 0, True, 1) == ErrorCode.INVALID_TXN_STATE


def test_rules_6_and_7_timeouts_and_expiry() -> None:
    md = _ongoing()  # started at 10 with a 60 s timeout
    assert machine.timed_out([md], 10 + 60_000) == []
    assert machine.timed_out([md], 10 + 60_001) == [md]
    idle = _fresh()
    assert machine.expired_ids([idle, md], idle.update_ms + 1001, 1000) == ["t"]
