"""Refused configs and requests: the exception text names the field and the
rule (bkv_last_error), and a later refusal of another call does not carry a
stale message."""
import pytest

import batchkv
from batchkv import GroupKind, KvGroup, Pool, Scheduler


class PlusOne:
    def forward(self, b, next_tokens):
        next_tokens[:] = 1


def test_pool_config_field_is_named():
    with pytest.raises(batchkv.InvalidArgumentError) as e:
        Pool(device_blocks=64, block_tokens=24)
    text = str(e.value)
    assert "bkv_pool_config.block_tokens = 24: must be a power of two" in text
    assert "invalid argument" in text and text.startswith("bkv_pool_create")
    assert batchkv.last_error().startswith("bkv_pool_config.block_tokens = 24")


def test_group_field_is_named():
    groups = [KvGroup(GroupKind.FULL, 2, 0, 64), KvGroup(GroupKind.WINDOW, 2, 0, 64)]
    with pytest.raises(batchkv.InvalidArgumentError) as e:
        Pool(device_blocks=64, block_tokens=16, groups=groups)
    assert "bkv_kv_group[1].span = 0" in str(e.value)


def test_sched_config_and_request_fields_are_named():
    with Pool(device_blocks=64) as pool:
        assert batchkv.last_error() == ""          # a successful create clears it
        with pytest.raises(batchkv.InvalidArgumentError) as e:
            Scheduler(pool, PlusOne(), max_running=0)
        assert "bkv_sched_config.max_running = 0" in str(e.value)
        with pytest.raises(batchkv.InvalidArgumentError) as e:
            Scheduler(pool, PlusOne(), preempt=batchkv.Preempt.SWAP)
        assert "bkv_sched_config.preempt" in str(e.value) and "host_blocks" in str(e.value)
        s = Scheduler(pool, PlusOne())
        with pytest.raises(batchkv.InvalidArgumentError) as e:
            s.submit([1, 2, 3], 0)
        assert "bkv_request.max_new_tokens = 0" in str(e.value)
        with pytest.raises(batchkv.TooBigError) as e:
            s.submit([1] * 2000, 10)
        assert "bkv_request." in str(e.value) and "blocks" in str(e.value)
        s.close()


def test_other_calls_carry_no_stale_message():
    with pytest.raises(batchkv.InvalidArgumentError):
        Pool(device_blocks=0)
    assert "device_blocks" in batchkv.last_error()
    with Pool(device_blocks=4) as p:
        with pytest.raises(batchkv.NotFoundError) as e:
            p.close_seq(12345)
        assert "bkv_pool_config" not in str(e.value)
