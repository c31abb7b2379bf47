//! Incremental update of the SCTP checksum (CRC32c) after a port rewrite.
//!
//! SCTP's checksum covers the whole packet, so rewriting a port would mean
//! reading every byte again. CRC is linear over GF(2) instead: for two equal
//! length messages that differ by `D`, `crc(M') = crc(M) ^ raw(D)`, where
//! `raw` is the CRC with zero initial value and no final XOR. Our `D` is
//! non-zero only in the four port bytes at the start, so `raw(D)` is those
//! four bytes as a polynomial times `x^(8 * len)`, modulo the polynomial:
//! two carry-less multiplications whatever the packet size.
//!
//! Polynomials are in the reflected form CRC32c uses: bit 31 is `x^0`.

/// CRC32c (Castagnoli) polynomial, reflected.
const POLY: u32 = 0x82F6_3B78;
/// `x^0` in the reflected representation.
const ONE: u32 = 1 << 31;
/// `x^8`: appending one zero byte multiplies by this.
const X8: u32 = 1 << 23;

/// `a * b mod POLY`. Branch-free, so the eBPF verifier walks one path
/// through it instead of one per bit pattern.
#[inline(always)]
pub const fn mul(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = 0;
    while bit < 32 {
        // All ones when bit `bit` (x^bit) of `a` is set.
        let take = 0u32.wrapping_sub((a >> (31 - bit)) & 1);
        product ^= b & take;
        // b *= x, reducing x^32 back into the low terms.
        b = (b >> 1) ^ (POLY & 0u32.wrapping_sub(b & 1));
        bit += 1;
    }
    product
}

/// `x^(8 * n) mod POLY` for n in 0..256: appending `n` zero bytes.
const ZERO_BYTES: [u32; 256] = powers(X8);

/// [`ZERO_BYTES`], read by [`zero_bytes_operator`] for a length's low byte:
/// a `static`, so the object holds it once.
static ZERO_BYTES_LOW: [u32; 256] = ZERO_BYTES;

/// `x^(8 * 256 * n) mod POLY` for n in 0..256, for a length's high byte:
/// appending `256 * n` zero bytes.
static ZERO_BYTES_HIGH: [u32; 256] = powers(mul(ZERO_BYTES[255], X8));

/// `step^n` for n in 0..256.
const fn powers(step: u32) -> [u32; 256] {
    let mut table = [ONE; 256];
    let mut n = 1;
    while n < 256 {
        table[n] = mul(table[n - 1], step);
        n += 1;
    }
    table
}

/// `x^(8 * bytes) mod POLY`: the effect of appending `bytes` zero bytes.
/// One multiplication of two table entries (its low and its high byte):
/// the eBPF verifier walks every step of a multiplication, and sixteen of
/// them (square and multiply) were once most of what it processed for the
/// tc programs, once per path that reaches an SCTP rewrite.
#[inline(always)]
pub fn zero_bytes_operator(bytes: u16) -> u32 {
    let [low, high] = bytes.to_le_bytes();
    mul(
        ZERO_BYTES_LOW[usize::from(low)],
        ZERO_BYTES_HIGH[usize::from(high)],
    )
}

/// New SCTP checksum field (as the little-endian value read from the packet)
/// after the four bytes at the start of the SCTP header (source and
/// destination port, as on the wire) changed from `old_ports` to `new_ports`.
/// `sctp_len` is the length of the SCTP packet: common header plus chunks.
///
/// The four changed bytes, fed to a raw CRC, are `le32(delta) * x^32`;
/// the `len - 4` bytes after them append as many zeros, `x^(8 * (len -
/// 4))`: together `le32(delta) * x^(8 * len)`, two multiplications (the
/// four bytes and the zeros taken apart made three). The eBPF verifier
/// walks every step of each, once per path that reaches an SCTP rewrite:
/// the third was 8% of what it processed for the tc programs.
#[inline(always)]
pub fn sctp_adjust(checksum_le: u32, old_ports: [u8; 4], new_ports: [u8; 4], sctp_len: u16) -> u32 {
    let delta = u32::from_le_bytes([
        old_ports[0] ^ new_ports[0],
        old_ports[1] ^ new_ports[1],
        old_ports[2] ^ new_ports[2],
        old_ports[3] ^ new_ports[3],
    ]);
    // No clamp for a length under 4 (a forged IP length: no SCTP packet
    // its receiver takes), whose checksum was as wrong before: the branch
    // a clamp compiles to split every path through it in two for the
    // verifier, which then processed more than its million instructions.
    checksum_le ^ mul(delta, zero_bytes_operator(sctp_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain bitwise CRC32c, the reference the fast path must match.
    fn crc32c(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ POLY
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn reference_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn zero_bytes_operator_matches_appending_zeros() {
        for n in [0u16, 1, 2, 3, 7, 8, 100, 1000, 1499, 9000, 65535] {
            let mut reference = 0x1234_5678u32;
            for _ in 0..n {
                for _ in 0..8 {
                    reference = if reference & 1 != 0 {
                        (reference >> 1) ^ POLY
                    } else {
                        reference >> 1
                    };
                }
            }
            assert_eq!(
                mul(0x1234_5678, zero_bytes_operator(n)),
                reference,
                "appending {n} zero bytes"
            );
        }
    }

    #[test]
    fn adjusted_checksum_equals_recomputed_checksum() {
        for len in [12usize, 16, 17, 28, 60, 255, 256, 257, 333, 1480] {
            let mut packet = [0u8; 1480];
            for (i, byte) in packet.iter_mut().enumerate().take(len) {
                *byte = (i as u8).wrapping_mul(31).wrapping_add(7);
            }
            let packet = &mut packet[..len];
            packet[8..12].fill(0);
            let before = crc32c(packet);
            let old_ports = [packet[0], packet[1], packet[2], packet[3]];
            let new_ports = [0x1f, 0x90, 0x00, 0x50];
            packet[..4].copy_from_slice(&new_ports);
            let after = crc32c(packet);
            assert_eq!(
                sctp_adjust(before, old_ports, new_ports, len as u16),
                after,
                "SCTP packet of {len} bytes"
            );
        }
    }
}
