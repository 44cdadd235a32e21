//! The engine against vectors recorded from torch.
//!
//! `testdata/torch_vectors.json` is written by `scripts/gen_sampler_vectors.py`
//! (`.venv/bin/python scripts/gen_sampler_vectors.py`; the torch version it
//! ran under is in the file). Every vector is checked for the values torch
//! produced *and* for where it left the generator: torch's `get_state()` bytes
//! are stored as SHA-256 digests, and the engine's state is written with
//! [`Mt19937::write_state_bytes`] into the recorded `get_state()` of a freshly
//! seeded generator before hashing, so the whole 5056-byte buffer must agree.
//!
//! Each test gathers every mismatch in its group before failing, so one run
//! shows the full extent of a divergence.

use super::{
    distributed_indices, randint_into, random_int64, randperm, BatchIter, Distributed, IndexSource,
    IndexVec, Mt19937, RandomIter, RngSource, SeededOnFirstUse, SequentialIter, SubsetRandomIter,
    STATE_BYTES,
};
use serde_json::Value;
use std::cell::RefCell;
use std::convert::Infallible;
use std::fmt::Debug;
use std::rc::Rc;
use std::sync::OnceLock;

const VECTORS: &str = include_str!("testdata/torch_vectors.json");

fn vectors() -> &'static Value {
    static PARSED: OnceLock<Value> = OnceLock::new();
    PARSED.get_or_init(|| serde_json::from_str(VECTORS).expect("torch_vectors.json parses"))
}

fn group(name: &str) -> &'static [Value] {
    vectors()[name]
        .as_array()
        .unwrap_or_else(|| panic!("torch_vectors.json has no array {name:?}"))
}

// ---------------------------------------------------------------- JSON access

fn u64_of(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key:?} is not a u64 in {v}"))
}

fn usize_of(v: &Value, key: &str) -> usize {
    usize::try_from(u64_of(v, key)).expect("fits usize")
}

fn i64_of(v: &Value, key: &str) -> i64 {
    v[key]
        .as_i64()
        .unwrap_or_else(|| panic!("{key:?} is not an i64 in {v}"))
}

fn bool_of(v: &Value, key: &str) -> bool {
    v[key]
        .as_bool()
        .unwrap_or_else(|| panic!("{key:?} is not a bool in {v}"))
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key:?} is not a string in {v}"))
}

/// A field that is `null` in the JSON (torch's `None`) or a non-negative int.
fn opt_u64_of(v: &Value, key: &str) -> Option<u64> {
    match &v[key] {
        Value::Null => None,
        x => Some(
            x.as_u64()
                .unwrap_or_else(|| panic!("{key:?} is neither null nor a u64 in {v}")),
        ),
    }
}

fn opt_usize_of(v: &Value, key: &str) -> Option<usize> {
    opt_u64_of(v, key).map(|x| usize::try_from(x).expect("fits usize"))
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_i64().unwrap_or_else(|| panic!("not an i64: {x}")))
        .collect()
}

fn int_lists(v: &Value) -> Vec<Vec<i64>> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(ints)
        .collect()
}

fn global_seed() -> u64 {
    u64_of(vectors(), "global_seed")
}

// ------------------------------------------------------- generator states

fn hex_decode(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd-length hex");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// torch's `get_state()` of `torch.Generator().manual_seed(seed)` (the same
/// bytes as the default generator after `torch.manual_seed(seed)`).
fn fresh_state(seed: u64) -> Vec<u8> {
    let hex = vectors()["fresh_states"][seed.to_string()]
        .as_str()
        .unwrap_or_else(|| panic!("no fresh state recorded for seed {seed}"));
    hex_decode(hex)
}

/// SHA-256 of the `get_state()` bytes torch would report for a generator
/// seeded with `seed` and now in the engine state `rng`.
fn state_digest(seed: u64, rng: &Mt19937) -> String {
    let mut bytes = fresh_state(seed);
    rng.write_state_bytes(&mut bytes)
        .expect("fresh state has STATE_BYTES bytes");
    sha256_hex(&bytes)
}

/// FIPS 180-4 SHA-256, enough to compare digests recorded with Python's
/// `hashlib` without another dependency.
fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&(data.len() as u64 * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (wi, word) in w.iter_mut().zip(block.chunks_exact(4)) {
            *wi = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for (k, wi) in K.iter().zip(w.iter()) {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(*k)
                .wrapping_add(*wi);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

// ------------------------------------------------------------ test plumbing

/// Mismatches of one group, reported together.
#[derive(Default)]
struct Mismatches(Vec<String>);

impl Mismatches {
    fn check<T: PartialEq + Debug>(
        &mut self,
        ctx: &dyn Fn() -> String,
        what: &str,
        got: T,
        want: T,
    ) {
        if got != want {
            self.0.push(format!(
                "{}: {what}\n    torch:  {want:?}\n    engine: {got:?}",
                ctx()
            ));
        }
    }

    fn finish(self, group: &str, checked: usize) {
        assert!(checked > 0, "no {group} vectors were checked");
        if !self.0.is_empty() {
            let shown: Vec<&str> = self.0.iter().take(25).map(String::as_str).collect();
            panic!(
                "{} of {checked} {group} checks disagree with torch {}:\n{}",
                self.0.len(),
                str_of(vectors(), "torch_version"),
                shown.join("\n")
            );
        }
    }
}

/// A generator shared between the test and the sampler that draws from it, as
/// a user's `torch.Generator` (or torch's default generator) is.
#[derive(Clone)]
struct Shared(Rc<RefCell<Mt19937>>);

impl Shared {
    fn new(seed: u64) -> Self {
        Shared(Rc::new(RefCell::new(Mt19937::new(seed))))
    }

    fn snapshot(&self) -> Mt19937 {
        self.0.borrow().clone()
    }
}

impl RngSource for Shared {
    type Error = Infallible;
    fn randperm(&mut self, n: usize) -> Result<IndexVec, Infallible> {
        self.0.borrow_mut().randperm(n)
    }
    fn randint(&mut self, high: i64, count: usize, out: &mut Vec<i64>) -> Result<(), Infallible> {
        self.0.borrow_mut().randint(high, count, out)
    }
    fn random_int64(&mut self) -> Result<i64, Infallible> {
        self.0.borrow_mut().random_int64()
    }
}

/// The generator a sampler vector ran with: the user's (`seed`), or, for
/// `generator=None`, torch's default generator after
/// `torch.manual_seed(global_seed)`.
struct Setup {
    seed: Option<u64>,
    user: Option<Shared>,
    global: Shared,
}

impl Setup {
    fn new(v: &Value) -> Self {
        let seed = opt_u64_of(v, "seed");
        Setup {
            seed,
            user: seed.map(Shared::new),
            global: Shared::new(global_seed()),
        }
    }

    /// What `RandomSampler` draws from: the user's generator, or a private one
    /// seeded from the default generator when iteration starts.
    fn random_sampler_rng(&self) -> SamplerRng {
        match &self.user {
            Some(g) => SamplerRng::User(g.clone()),
            None => SamplerRng::Private(SeededOnFirstUse::Pending(self.global.clone())),
        }
    }

    /// What `SubsetRandomSampler` draws from: `randperm(generator=None)` uses
    /// the default generator directly.
    fn direct_rng(&self) -> SamplerRng {
        SamplerRng::User(self.user.clone().unwrap_or_else(|| self.global.clone()))
    }

    /// Digest of the generator torch recorded (`state_sha256`): the user's
    /// when there is one, else the default generator.
    fn digest(&self) -> String {
        match &self.user {
            Some(g) => state_digest(self.seed.expect("user seed"), &g.snapshot()),
            None => state_digest(global_seed(), &self.global.snapshot()),
        }
    }

    /// With a user generator torch never touches the default one.
    fn global_untouched(&self) -> bool {
        self.global.snapshot() == Mt19937::new(global_seed())
    }
}

enum SamplerRng {
    User(Shared),
    Private(SeededOnFirstUse<Shared>),
}

impl SamplerRng {
    fn rng(&mut self) -> &mut dyn RngSource<Error = Infallible> {
        match self {
            SamplerRng::User(g) => g,
            SamplerRng::Private(g) => g,
        }
    }
}

impl RngSource for SamplerRng {
    type Error = Infallible;
    fn randperm(&mut self, n: usize) -> Result<IndexVec, Infallible> {
        self.rng().randperm(n)
    }
    fn randint(&mut self, high: i64, count: usize, out: &mut Vec<i64>) -> Result<(), Infallible> {
        self.rng().randint(high, count, out)
    }
    fn random_int64(&mut self) -> Result<i64, Infallible> {
        self.rng().random_int64()
    }
    fn private(&self) -> bool {
        matches!(self, SamplerRng::Private(_))
    }
}

/// Pulls `take` indices (all when `None`), no more, as a Python consumer
/// calling `next()` `take` times would.
fn pull<S: IndexSource<Index = i64, Error = Infallible>>(
    s: &mut S,
    take: Option<usize>,
) -> Vec<i64> {
    let mut out = Vec::new();
    while take.is_none_or(|k| out.len() < k) {
        match s.next_index() {
            Ok(Some(i)) => out.push(i),
            Ok(None) => break,
            Err(e) => match e {},
        }
    }
    out
}

/// Python's spelling of the arguments, for mismatch reports.
fn py_opt(v: Option<usize>) -> String {
    v.map_or_else(|| "None".to_owned(), |x| x.to_string())
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

fn py_generator(seed: Option<u64>) -> String {
    seed.map_or_else(
        || "None".to_owned(),
        |s| format!("torch.Generator().manual_seed({s})"),
    )
}

fn checksum(values: &[i64]) -> i64 {
    values.iter().zip(0i64..).map(|(&v, i)| i * v).sum()
}

// -------------------------------------------------------------------- tests

/// The generator checks every sampler case ends with: the state torch left
/// the sampler's generator in and, with an explicit generator, the global
/// one untouched.
fn check_generators(bad: &mut Mismatches, ctx: &dyn Fn() -> String, setup: &Setup, v: &Value) {
    bad.check(
        ctx,
        "generator state after both epochs",
        setup.digest(),
        str_of(v, "state_sha256").to_owned(),
    );
    if setup.seed.is_some() {
        bad.check(
            ctx,
            "default generator untouched",
            setup.global_untouched(),
            true,
        );
    }
}

#[test]
fn sha256_known_answers() {
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        sha256_hex(&[b'a'; 1000]),
        "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
    );
}

#[test]
fn recorded_with_torch() {
    let version = str_of(vectors(), "torch_version");
    assert!(
        version.starts_with('2'),
        "unexpected torch version {version}"
    );
    assert_eq!(usize_of(vectors(), "state_bytes"), STATE_BYTES);
}

#[test]
fn fresh_states_match_manual_seed() {
    let mut bad = Mismatches::default();
    let states = vectors()["fresh_states"].as_object().expect("fresh_states");
    for (key, hex) in states {
        let seed: u64 = key.parse().expect("seed key is a u64");
        let bytes = hex_decode(hex.as_str().expect("hex string"));
        let ctx = || format!("fresh state, seed {seed}");
        let want = Mt19937::new(seed);
        // Every byte, cached-normal fields and padding included, is what the
        // engine writes into a zeroed buffer.
        let mut written = vec![0u8; STATE_BYTES];
        want.write_state_bytes(&mut written).expect("size");
        bad.check(&ctx, "get_state() bytes", written == bytes, true);
        match Mt19937::from_state_bytes(&bytes) {
            Ok(read) => {
                bad.check(&ctx, "initial_seed", read.initial_seed(), seed);
                bad.check(&ctx, "engine read back", read == want, true);
            }
            Err(e) => bad.0.push(format!("{}: rejected: {e}", ctx())),
        }
    }
    bad.finish("fresh state", states.len());
}

#[test]
fn randperm_matches_torch() {
    let mut bad = Mismatches::default();
    let cases = group("randperm");
    for v in cases {
        let (seed, n) = (u64_of(v, "seed"), usize_of(v, "n"));
        let ctx = || format!("randperm(n={n}, manual_seed({seed}))");
        let mut rng = Mt19937::new(seed);
        let perm = randperm(n, &mut rng);
        let head = ints(&v["head"]);
        bad.check(&ctx, "len", perm.len(), n);
        bad.check(&ctx, "head", &perm[..head.len().min(perm.len())], &head[..]);
        bad.check(&ctx, "sum(i * v)", checksum(&perm), i64_of(v, "checksum"));
        bad.check(
            &ctx,
            "state after",
            state_digest(seed, &rng),
            str_of(v, "state_sha256").to_owned(),
        );
    }
    bad.finish("randperm", cases.len());
}

#[test]
fn randint_matches_torch() {
    let mut bad = Mismatches::default();
    let cases = group("randint");
    for v in cases {
        let (seed, high) = (u64_of(v, "seed"), i64_of(v, "high"));
        let want = ints(&v["values"]);
        let ctx = || format!("randint({high}, ({},), manual_seed({seed}))", want.len());
        let mut rng = Mt19937::new(seed);
        let mut got = Vec::new();
        randint_into(high, want.len(), &mut rng, &mut got);
        bad.check(&ctx, "values", &got, &want);
        bad.check(
            &ctx,
            "state after",
            state_digest(seed, &rng),
            str_of(v, "state_sha256").to_owned(),
        );
    }
    bad.finish("randint", cases.len());
}

#[test]
fn random_int64_matches_torch() {
    let mut bad = Mismatches::default();
    let cases = group("random_int64");
    for v in cases {
        let seed = u64_of(v, "seed");
        let want = ints(&v["values"]);
        let ctx = || format!("{} x int64 random_(), manual_seed({seed})", want.len());
        let mut rng = Mt19937::new(seed);
        let got: Vec<i64> = (0..want.len()).map(|_| random_int64(&mut rng)).collect();
        bad.check(&ctx, "values", &got, &want);
        bad.check(
            &ctx,
            "state after",
            state_digest(seed, &rng),
            str_of(v, "state_sha256").to_owned(),
        );
    }
    bad.finish("random_int64", cases.len());
}

#[test]
fn mixed_draws_chain_like_torch() {
    let mut bad = Mismatches::default();
    let cases = group("mixed");
    for v in cases {
        let seed = u64_of(v, "seed");
        let mut rng = Mt19937::new(seed);
        let steps = v["steps"].as_array().expect("steps");
        for (i, step) in steps.iter().enumerate() {
            let op = str_of(step, "op");
            let ctx = || format!("mixed draws, manual_seed({seed}), step {i} ({op} {step})");
            match op {
                "randperm" => {
                    let perm = randperm(usize_of(step, "n"), &mut rng);
                    let head = ints(&step["head"]);
                    bad.check(&ctx, "head", &perm[..head.len().min(perm.len())], &head[..]);
                    bad.check(
                        &ctx,
                        "sum(i * v)",
                        checksum(&perm),
                        i64_of(step, "checksum"),
                    );
                }
                "randint" => {
                    let want = ints(&step["values"]);
                    let mut got = Vec::new();
                    randint_into(i64_of(step, "high"), want.len(), &mut rng, &mut got);
                    bad.check(&ctx, "values", got, want);
                }
                "random_int64" => {
                    let want = ints(&step["values"]);
                    let got: Vec<i64> = want.iter().map(|_| random_int64(&mut rng)).collect();
                    bad.check(&ctx, "values", got, want);
                }
                other => panic!("unknown op {other:?}"),
            }
        }
        bad.check(
            &|| format!("mixed draws, manual_seed({seed})"),
            "state after",
            state_digest(seed, &rng),
            str_of(v, "state_sha256").to_owned(),
        );
    }
    bad.finish("mixed", cases.len());
}

#[test]
fn random_sampler_matches_torch() {
    let mut bad = Mismatches::default();
    let cases = group("random_sampler");
    for v in cases {
        let setup = Setup::new(v);
        let n = usize_of(v, "n");
        let num_samples = opt_usize_of(v, "num_samples");
        let replacement = bool_of(v, "replacement");
        let take = opt_usize_of(v, "take");
        let ctx = || {
            format!(
                "RandomSampler(range({n}), replacement={}, num_samples={}, generator={}), \
                 take {}",
                py_bool(replacement),
                py_opt(num_samples),
                py_generator(setup.seed),
                py_opt(take)
            )
        };
        for (epoch, want) in int_lists(&v["epochs"]).into_iter().enumerate() {
            let mut it = RandomIter::new(
                n,
                num_samples.unwrap_or(n),
                replacement,
                setup.random_sampler_rng(),
            );
            let got = pull(&mut it, take);
            bad.check(&ctx, &format!("epoch {epoch} indices"), got, want);
        }
        check_generators(&mut bad, &ctx, &setup, v);
    }
    bad.finish("RandomSampler", cases.len());
}

#[test]
fn subset_random_sampler_matches_torch() {
    let mut bad = Mismatches::default();
    let cases = group("subset_random");
    for v in cases {
        let setup = Setup::new(v);
        let indices = ints(&v["indices"]);
        let take = opt_usize_of(v, "take");
        let ctx = || {
            format!(
                "SubsetRandomSampler({indices:?}, generator={}), take {}",
                py_generator(setup.seed),
                py_opt(take)
            )
        };
        for (epoch, want) in int_lists(&v["epochs"]).into_iter().enumerate() {
            let mut it = SubsetRandomIter::new(indices.clone(), setup.direct_rng());
            let got = pull(&mut it, take);
            bad.check(&ctx, &format!("epoch {epoch} indices"), got, want);
        }
        check_generators(&mut bad, &ctx, &setup, v);
    }
    bad.finish("SubsetRandomSampler", cases.len());
}

#[test]
fn distributed_sampler_matches_torch() {
    let mut bad = Mismatches::default();
    let cases = group("distributed");
    let mut checked = 0;
    for v in cases {
        let n = usize_of(v, "n");
        let replicas = usize_of(v, "num_replicas");
        let shuffle = bool_of(v, "shuffle");
        let drop_last = bool_of(v, "drop_last");
        let torch_seed = u64_of(v, "torch_seed");
        let num_samples = usize_of(v, "num_samples");
        let total_size = usize_of(v, "total_size");
        for (rank, want) in int_lists(&v["per_rank"]).into_iter().enumerate() {
            checked += 1;
            let ctx = || {
                format!(
                    "DistributedSampler(range({n}), num_replicas={replicas}, rank={rank}, \
                     shuffle={}, seed={}, drop_last={}), set_epoch({})",
                    py_bool(shuffle),
                    i64_of(v, "seed"),
                    py_bool(drop_last),
                    u64_of(v, "epoch")
                )
            };
            let got = distributed_indices(&Distributed {
                n,
                num_replicas: replicas,
                rank,
                shuffle,
                seed: torch_seed,
                drop_last,
                num_samples,
                total_size,
            });
            bad.check(&ctx, "indices", got, Ok(want));
        }
    }
    bad.finish("DistributedSampler", checked);
}

#[test]
fn batch_sampler_matches_torch() {
    let mut bad = Mismatches::default();
    let cases = group("batch");
    for v in cases {
        let setup = Setup::new(v);
        let source = str_of(v, "source");
        let n = usize_of(v, "n");
        let num_samples = opt_usize_of(v, "num_samples");
        let replacement = bool_of(v, "replacement");
        let batch_size = usize_of(v, "batch_size");
        let drop_last = bool_of(v, "drop_last");
        let take = opt_usize_of(v, "take");
        let ctx = || {
            format!(
                "BatchSampler({source}(n={n}, num_samples={}, replacement={}, generator={}), \
                 batch_size={batch_size}, drop_last={}), take {}",
                py_opt(num_samples),
                py_bool(replacement),
                py_generator(setup.seed),
                py_bool(drop_last),
                py_opt(take)
            )
        };
        let got = match source {
            "sequential" => batches(SequentialIter::new(n), batch_size, drop_last, take),
            "random" => batches(
                RandomIter::new(
                    n,
                    num_samples.unwrap_or(n),
                    replacement,
                    setup.random_sampler_rng(),
                ),
                batch_size,
                drop_last,
                take,
            ),
            "subset" => {
                // The script's subset: list(range(100, 100 + 7 * n, 7)).
                let indices: Vec<i64> = (0..n as i64).map(|i| 100 + 7 * i).collect();
                batches(
                    SubsetRandomIter::new(indices, setup.direct_rng()),
                    batch_size,
                    drop_last,
                    take,
                )
            }
            other => panic!("unknown batch source {other:?}"),
        };
        let want = int_lists(&v["batches"]);
        if take.is_none() {
            bad.check(&ctx, "len(batch_sampler)", got.len(), usize_of(v, "len"));
        }
        bad.check(&ctx, "batches", got, want);
        bad.check(
            &ctx,
            "generator state after",
            setup.digest(),
            str_of(v, "state_sha256").to_owned(),
        );
        if setup.seed.is_some() {
            bad.check(
                &ctx,
                "default generator untouched",
                setup.global_untouched(),
                true,
            );
        }
    }
    bad.finish("BatchSampler", cases.len());
}

fn batches<S: IndexSource<Index = i64, Error = Infallible>>(
    source: S,
    batch_size: usize,
    drop_last: bool,
    take: Option<usize>,
) -> Vec<Vec<i64>> {
    let mut it = BatchIter::new(source, batch_size, drop_last);
    let mut out = Vec::new();
    let mut all = Vec::new();
    while take.is_none_or(|k| all.len() < k) {
        match it.next_batch(&mut out) {
            Ok(true) => all.push(out.clone()),
            Ok(false) => break,
            Err(e) => match e {},
        }
    }
    all
}
