//! dist/'s systemd unit, built in (the guests run the tests without the source tree).

/// dist/'s systemd unit, which the DaemonSet and the limits tests keep in step with: built
/// into the test binaries, which the guests run without the source tree.
pub const UNIT: &str = include_str!("../../../dist/memlock-trace.service");

/// The value of each of the unit's `key=` lines, in order.
pub fn unit_values(key: &str) -> Vec<String> {
    let values: Vec<String> = UNIT
        .lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
        .collect();
    assert!(
        !values.is_empty(),
        "no {key}= in dist/memlock-trace.service"
    );
    values
}
