//! Helpers shared by the unit tests.

use proptest::prelude::ProptestConfig;

/// Cases of one property test under Miri, which interprets every step
/// (thousands of times slower than a native run).
pub const MIRI_CASES: u32 = 3;

/// `config` as it is natively; under Miri with at most [`MIRI_CASES`] cases
/// and no regression files (Miri's isolation has no file system; the
/// committed regressions still replay in native runs).
pub fn miri_friendly(config: ProptestConfig) -> ProptestConfig {
    if cfg!(miri) {
        ProptestConfig {
            cases: config.cases.min(MIRI_CASES),
            failure_persistence: None,
            ..config
        }
    } else {
        config
    }
}
