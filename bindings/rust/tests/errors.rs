//! Refused configs and requests: the error's Display names the field and the
//! rule (`bkv_last_error`), and errors still compare by kind.
use batchkv::*;

struct Echo;

impl Host for Echo {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        for r in 0..b.n_rows() {
            next[r] = 1;
        }
        Ok(())
    }
}

#[test]
fn pool_config_field_is_named_in_display() {
    let cfg = PoolConfig { device_blocks: 64, block_tokens: 24, ..Default::default() };
    let err = Pool::new(&cfg).err().unwrap();
    assert_eq!(err, Error::InvalidArgument);
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let text = err.to_string();
    assert!(text.starts_with("invalid argument: "), "{}", text);
    assert!(text.contains("bkv_pool_config.block_tokens = 24: must be a power of two"), "{}", text);
    assert_eq!(err.detail(), Some(last_error().as_str()));
}

#[test]
fn group_field_is_named() {
    let cfg = PoolConfig { device_blocks: 64, ..Default::default() };
    let groups = [KvGroup::full(2, 64), KvGroup::window(2, 0, 64)];
    let err = Pool::with_groups(&cfg, &groups).err().unwrap();
    assert!(err.to_string().contains("bkv_kv_group[1].span = 0"), "{}", err);
}

#[test]
fn sched_config_and_request_fields_are_named() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    assert_eq!(last_error(), "");
    let cfg = SchedConfig { max_running: 0, ..Default::default() };
    let err = Scheduler::new(&mut pool, Echo, &cfg, None).err().unwrap();
    assert!(err.to_string().contains("bkv_sched_config.max_running = 0"), "{}", err);
    let s = Scheduler::new(&mut pool, Echo, &SchedConfig::default(), None).unwrap();
    let err = s.submit(&Request::new(&[1, 2, 3], 0)).unwrap_err();
    assert!(err.to_string().contains("bkv_request.max_new_tokens = 0"), "{}", err);
}

#[test]
fn other_calls_carry_no_message() {
    let mut p = Pool::new(&PoolConfig { device_blocks: 4, ..Default::default() }).unwrap();
    assert!(Pool::new(&PoolConfig::default()).is_err()); // device_blocks 0
    let err = p.close_seq(12345).unwrap_err();
    assert_eq!(err, Error::NotFound);
    assert_eq!(err.detail(), None);
    assert_eq!(err.to_string(), "no such sequence or request");
}
