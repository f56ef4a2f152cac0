use super::*;
use std::os::unix::net::UnixDatagram;

#[test]
fn a_readable_descriptor_is_named_until_served() {
    let (a, a_peer) = UnixDatagram::pair().unwrap();
    let (b, b_peer) = UnixDatagram::pair().unwrap();
    let mut set = WaitSet::new().unwrap();
    let ka = set.attach(&a).unwrap();
    let kb = set.attach(&b).unwrap();
    assert_eq!((ka.index(), kb.index()), (0, 1));
    assert!(set.wait(Some(Duration::ZERO)).unwrap().is_empty());
    b_peer.send(b"x").unwrap();
    assert_eq!(set.wait(Some(Duration::from_secs(5))).unwrap(), vec![kb]);
    assert_eq!(
        set.wait(Some(Duration::ZERO)).unwrap(),
        vec![kb],
        "not served: still ready"
    );
    let mut buf = [0u8; 8];
    b.recv(&mut buf).unwrap();
    assert!(
        set.wait(Some(Duration::ZERO)).unwrap().is_empty(),
        "served: quiet"
    );
    a_peer.send(b"y").unwrap();
    b_peer.send(b"z").unwrap();
    let mut both = set.wait(Some(Duration::from_secs(5))).unwrap();
    both.sort();
    assert_eq!(both, vec![ka, kb]);
}

#[test]
fn a_detached_descriptor_is_not_named_and_its_source_stays_usable() {
    let (a, a_peer) = UnixDatagram::pair().unwrap();
    let mut set = WaitSet::new().unwrap();
    let ka = set.attach(&a).unwrap();
    assert!(set.detach(ka));
    assert!(!set.detach(ka), "once");
    a_peer.send(b"x").unwrap();
    assert!(
        set.wait(Some(Duration::from_millis(20)))
            .unwrap()
            .is_empty()
    );
    let mut buf = [0u8; 8];
    assert_eq!(
        a.recv(&mut buf).unwrap(),
        1,
        "the source itself was never taken"
    );
}

#[test]
fn deadlines_are_named_once_passed_and_bound_the_wait() {
    let (a, _peer) = UnixDatagram::pair().unwrap();
    let mut set = WaitSet::new().unwrap();
    set.attach(&a).unwrap();
    let start = Instant::now();
    let soon = set.attach_deadline(start + Duration::from_millis(30));
    let later = set.attach_deadline(start + Duration::from_secs(60));
    assert_eq!(
        set.wait(None).unwrap(),
        vec![soon],
        "the earliest deadline ends a wait with no timeout"
    );
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(30) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(
        set.wait(Some(Duration::from_millis(10)))
            .unwrap()
            .is_empty(),
        "named once"
    );
    assert!(set.detach(later));
}

#[test]
fn an_empty_set_without_a_timeout_returns_at_once() {
    let mut set = WaitSet::new().unwrap();
    assert!(set.wait(None).unwrap().is_empty());
}

#[test]
fn a_set_is_readable_while_an_attachment_is() {
    let (a, a_peer) = UnixDatagram::pair().unwrap();
    let mut inner = WaitSet::new().unwrap();
    inner.attach(&a).unwrap();
    let mut outer = WaitSet::new().unwrap();
    let k = outer.attach(&inner).unwrap();
    assert!(outer.wait(Some(Duration::ZERO)).unwrap().is_empty());
    a_peer.send(b"x").unwrap();
    assert_eq!(outer.wait(Some(Duration::from_secs(5))).unwrap(), vec![k]);
}
