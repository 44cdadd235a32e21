//! torch's CPU generator: a 32-bit MT19937 (`at::mt19937`) plus the byte layout
//! of `torch.Generator.get_state()` (`CPUGeneratorImplState`), so that a
//! user's generator can be advanced here and handed back in the same state
//! torch would have left it in.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UMASK: u32 = 0x8000_0000;
const LMASK: u32 = 0x7fff_ffff;

/// Size of `CPUGeneratorImplState` on 64-bit little-endian Linux.
pub const STATE_BYTES: usize = 5056;
// Offsets inside THGeneratorStateLegacy: seed u64 @0, left i32 @8,
// seeded i32 @12, next u64 @16, state [u64; 624] @24.
const OFF_SEED: usize = 0;
const OFF_LEFT: usize = 8;
const OFF_SEEDED: usize = 12;
const OFF_NEXT: usize = 16;
const OFF_STATE: usize = 24;

/// torch's `at::mt19937`, draw for draw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mt19937 {
    seed: u64,
    left: i32,
    next: u32,
    state: [u32; N],
}

/// A state buffer that is not a CPU generator state torch would produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError(pub String);

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid torch generator state: {}", self.0)
    }
}

impl std::error::Error for StateError {}

impl Mt19937 {
    /// `torch.Generator().manual_seed(seed)`: only the low 32 bits seed the engine.
    pub fn new(seed: u64) -> Self {
        let mut state = [0u32; N];
        state[0] = seed as u32;
        for j in 1..N {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(j as u32);
        }
        Mt19937 {
            seed,
            left: 1,
            next: 0,
            state,
        }
    }

    /// Python's `random.Random(seed)` for a seed below 2**32
    /// (`init_by_array` over its one 32-bit word), so a simulation drawn
    /// here repeats the one Python drew.
    pub fn python(seed: u32) -> Self {
        let mut mt = Mt19937::new(19_650_218);
        let st = &mut mt.state;
        let mut i = 1usize;
        for _ in 0..N {
            // (a key of one word: its index, added too, is always 0)
            let prev = st[i - 1] ^ (st[i - 1] >> 30);
            st[i] = (st[i] ^ prev.wrapping_mul(1_664_525)).wrapping_add(seed);
            i += 1;
            if i >= N {
                st[0] = st[N - 1];
                i = 1;
            }
        }
        for _ in 0..N - 1 {
            let prev = st[i - 1] ^ (st[i - 1] >> 30);
            st[i] = (st[i] ^ prev.wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                st[0] = st[N - 1];
                i = 1;
            }
        }
        st[0] = 0x8000_0000;
        mt.seed = u64::from(seed);
        mt
    }

    /// The seed the generator was created with (`initial_seed()`).
    pub fn initial_seed(&self) -> u64 {
        self.seed
    }

    fn twist(u: u32, v: u32) -> u32 {
        let mixed = (u & UMASK) | (v & LMASK);
        (mixed >> 1) ^ if v & 1 == 1 { MATRIX_A } else { 0 }
    }

    fn next_state(&mut self) {
        self.left = N as i32;
        self.next = 0;
        for i in 0..N - M {
            self.state[i] = self.state[i + M] ^ Self::twist(self.state[i], self.state[i + 1]);
        }
        for i in N - M..N - 1 {
            self.state[i] = self.state[i + M - N] ^ Self::twist(self.state[i], self.state[i + 1]);
        }
        self.state[N - 1] = self.state[M - 1] ^ Self::twist(self.state[N - 1], self.state[0]);
    }

    /// `CPUGeneratorImpl::random()`.
    pub fn next_u32(&mut self) -> u32 {
        self.left -= 1;
        if self.left == 0 {
            self.next_state();
        }
        let mut y = self.state[self.next as usize];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `CPUGeneratorImpl::random64()`: first draw is the high word.
    pub fn next_u64(&mut self) -> u64 {
        let hi = self.next_u32() as u64;
        let lo = self.next_u32() as u64;
        (hi << 32) | lo
    }

    /// Reads the engine out of `generator.get_state()` bytes.
    pub fn from_state_bytes(bytes: &[u8]) -> Result<Self, StateError> {
        if bytes.len() != STATE_BYTES {
            return Err(StateError(format!(
                "expected {STATE_BYTES} bytes, got {}",
                bytes.len()
            )));
        }
        let seed = read_u64(bytes, OFF_SEED);
        let left = read_u32(bytes, OFF_LEFT) as i32;
        let seeded = read_u32(bytes, OFF_SEEDED);
        let next = read_u64(bytes, OFF_NEXT);
        if seeded == 0 || left <= 0 || left > N as i32 || next > N as u64 {
            return Err(StateError(format!(
                "left={left} next={next} seeded={seeded} out of range"
            )));
        }
        let mut state = [0u32; N];
        for (i, s) in state.iter_mut().enumerate() {
            *s = read_u64(bytes, OFF_STATE + 8 * i) as u32;
        }
        Ok(Mt19937 {
            seed,
            left,
            next: next as u32,
            state,
        })
    }

    /// Writes the engine into a `get_state()` buffer, leaving every other
    /// field (cached normal samples) as it was.
    pub fn write_state_bytes(&self, bytes: &mut [u8]) -> Result<(), StateError> {
        if bytes.len() != STATE_BYTES {
            return Err(StateError(format!(
                "expected {STATE_BYTES} bytes, got {}",
                bytes.len()
            )));
        }
        bytes[OFF_SEED..OFF_SEED + 8].copy_from_slice(&self.seed.to_le_bytes());
        bytes[OFF_LEFT..OFF_LEFT + 4].copy_from_slice(&self.left.to_le_bytes());
        bytes[OFF_SEEDED..OFF_SEEDED + 4].copy_from_slice(&1u32.to_le_bytes());
        bytes[OFF_NEXT..OFF_NEXT + 8].copy_from_slice(&(self.next as u64).to_le_bytes());
        for (i, s) in self.state.iter().enumerate() {
            let off = OFF_STATE + 8 * i;
            bytes[off..off + 8].copy_from_slice(&(*s as u64).to_le_bytes());
        }
        Ok(())
    }
}

fn read_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn read_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_reference_mt19937_for_seed_5489() {
        // The 10000th output of the standard MT19937 seeded with 5489 is
        // 4123659995 (C++ [rand.predef]); torch's engine is the same algorithm.
        let mut mt = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10000 {
            last = mt.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn python_random_seeds_by_array() {
        // random.Random(12345).getrandbits(32) for the first three draws
        let mut mt = Mt19937::python(12345);
        let got: Vec<u32> = (0..3).map(|_| mt.next_u32()).collect();
        assert_eq!(got, [1_789_368_711, 3_146_859_322, 43_676_229]);
    }

    #[test]
    fn state_bytes_round_trip_mid_stream() {
        let mut mt = Mt19937::new(42);
        for _ in 0..1000 {
            mt.next_u32();
        }
        let mut bytes = vec![0xAAu8; STATE_BYTES];
        mt.write_state_bytes(&mut bytes).unwrap();
        // Fields past the engine are untouched.
        assert_eq!(bytes[STATE_BYTES - 1], 0xAA);
        let mut back = Mt19937::from_state_bytes(&bytes).unwrap();
        assert_eq!(back, mt);
        assert_eq!(back.next_u64(), mt.next_u64());
    }

    #[test]
    fn rejects_wrong_size_and_unseeded_states() {
        assert!(Mt19937::from_state_bytes(&[0u8; 16]).is_err());
        assert!(Mt19937::from_state_bytes(&[0u8; STATE_BYTES]).is_err());
    }
}
