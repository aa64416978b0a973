//! SHA-256 of bundle files, streamed through one large buffer so verifying hundreds of megabytes
//! costs one sequential read.

use std::io::{self, Read};

use sha2::{Digest, Sha256};

/// Bytes read per call when hashing a file. Large reads keep the hashing loop, not the system
/// calls, the cost.
pub(crate) const HASH_BUFFER_BYTES: usize = 4 << 20;

/// Lower-case hex of a SHA-256 digest.
pub(crate) fn hex(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(digest.len() * 2);
    for byte in digest {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    out
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Whether `text` is a SHA-256 as the manifest spells it: 64 lower-case hex digits.
pub(crate) fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Hashes everything `reader` yields; returns the hex digest and the number of bytes read.
pub(crate) fn sha256_of_reader(reader: &mut impl Read) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; HASH_BUFFER_BYTES];
    let mut total_bytes = 0u64;
    loop {
        let n = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buffer[..n]);
        total_bytes += n as u64;
    }
    Ok((hex(&hasher.finalize()), total_bytes))
}

/// A writer that hashes and counts what passes through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written_bytes: u64,
}

impl<W: io::Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter { inner, hasher: Sha256::new(), written_bytes: 0 }
    }

    /// The inner writer, the hex digest and the byte count of everything written.
    pub(crate) fn finish(self) -> (W, String, u64) {
        (self.inner, hex(&self.hasher.finalize()), self.written_bytes)
    }
}

impl<W: io::Write> io::Write for HashingWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(bytes)?;
        self.hasher.update(&bytes[..n]);
        self.written_bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
