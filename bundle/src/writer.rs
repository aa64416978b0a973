//! Writing a bundle: tensors stream to disk one at a time, files are copied in, and the manifest
//! is written last, atomically, so a directory with a `manifest.json` is always a whole bundle —
//! also after a power loss when [`WriteOptions::sync`] is set; without it a power loss right after
//! `finish` can leave files the kernel had not written out yet, which their digests in the
//! manifest then refuse at load.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::digest::{digest_of_file, HashingWriter, HASH_BUFFER_BYTES};
use super::manifest::{Drafter, FileEntry, Manifest, ManifestHeader, Target, FORMAT_VERSION};
use super::paths::check_relative_path;
use super::safetensors::{
    byte_len, encode_header, encode_header_padded, HeaderEntry, ALIGNMENT_BYTES, PADDING_PREFIX, RESERVED_PREFIX,
};
use super::{BundleError, Dtype, MANIFEST_FILE, WEIGHTS_FILE};

/// The weights file while tensors are added: their data starts [`HEADER_RESERVE_BYTES`] in, and
/// `finish` writes the header (known only at the end) into the space before it and renames the
/// file. A header that does not fit, or data under [`COMPACT_BELOW_BYTES`], is written into a new
/// file with the data copied behind it instead.
const DATA_TEMP_FILE: &str = ".weights.data.partial";
/// Space for the header before the tensor data: 256 KiB holds about a thousand entries.
const HEADER_RESERVE_BYTES: u64 = 256 << 10;
/// Weights files with less tensor data than this are compacted (no reserved space left over).
const COMPACT_BELOW_BYTES: u64 = 64 << 20;
const MANIFEST_TEMP_FILE: &str = ".manifest.json.partial";

/// How [`BundleWriter::create_with`] treats an existing directory, and whether it waits for the
/// disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Replace an existing bundle (a directory holding `manifest.json` or `weights.safetensors`,
    /// possibly a partial one): it is deleted with everything in it. A non-empty directory that
    /// is not a bundle is refused even then.
    pub overwrite: bool,
    /// Wait until every file is on the disk (fsync, then the directory) before `finish` returns.
    /// For 2.4 GB of weights that is 0.3–1 s on a virtual disk; compilers and model savers
    /// commonly leave it to the kernel.
    pub sync: bool,
}

/// What [`BundleWriter::finish`] wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BundleSummary {
    pub dir: PathBuf,
    pub target: Target,
    /// Every file the manifest lists (all but `manifest.json`), sorted by path.
    pub files: Vec<FileEntry>,
    /// Model tensors in the weights file (alignment fillers not counted).
    pub tensors: usize,
    /// Bytes of all listed files plus the manifest.
    pub total_bytes: u64,
}

/// Writes one bundle directory. Nothing is loadable until [`BundleWriter::finish`] has written
/// `manifest.json`; dropping the writer before that leaves no manifest and removes the temporary
/// tensor data.
pub struct BundleWriter {
    dir: PathBuf,
    header: ManifestHeader,
    data_path: PathBuf,
    data: BufWriter<File>,
    data_len: u64,
    entries: Vec<HeaderEntry>,
    tensor_names: BTreeSet<String>,
    fillers: usize,
    sync: bool,
    files: BTreeMap<String, FileEntry>,
    drafter: Option<Drafter>,
}

impl BundleWriter {
    /// Starts a bundle in `dir`, which must not exist or be empty.
    pub fn create(dir: impl AsRef<Path>, header: ManifestHeader) -> Result<BundleWriter, BundleError> {
        BundleWriter::create_with(dir, header, WriteOptions::default())
    }

    pub fn create_with(
        dir: impl AsRef<Path>,
        header: ManifestHeader,
        options: WriteOptions,
    ) -> Result<BundleWriter, BundleError> {
        let dir = dir.as_ref().to_path_buf();
        prepare_directory(&dir, options.overwrite)?;
        let data_path = dir.join(DATA_TEMP_FILE);
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&data_path)
            .map_err(|e| BundleError::io(&data_path, e))?;
        let mut data = data;
        data.seek(SeekFrom::Start(HEADER_RESERVE_BYTES)).map_err(|e| BundleError::io(&data_path, e))?;
        Ok(BundleWriter {
            dir,
            header,
            data_path,
            data: BufWriter::with_capacity(1 << 20, data),
            data_len: 0,
            entries: Vec::new(),
            tensor_names: BTreeSet::new(),
            fillers: 0,
            sync: options.sync,
            files: BTreeMap::new(),
            drafter: None,
        })
    }

    /// Appends one tensor whose bytes (`dtype` × `shape` of them, little-endian) are in memory.
    /// `layout` describes a packed layout for the executor; it is stored with the tensor.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: &[usize],
        bytes: &[u8],
        layout: Option<&serde_json::Value>,
    ) -> Result<(), BundleError> {
        self.add_tensor_with(name, dtype, shape, layout, |sink| sink.write_all(bytes))
    }

    /// Appends one tensor whose bytes `write` produces, in as many pieces as it likes, into the
    /// sink it is given (so a packer never needs the whole tensor in memory). Exactly `dtype` ×
    /// `shape` bytes must be written; otherwise the tensor is refused and the file is left as it
    /// was before the call.
    pub fn add_tensor_with(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: &[usize],
        layout: Option<&serde_json::Value>,
        write: impl FnOnce(&mut TensorSink<'_>) -> io::Result<()>,
    ) -> Result<(), BundleError> {
        let refuse = |problem: String| BundleError::InvalidTensor { tensor: name.to_string(), problem };
        if name.is_empty() {
            return Err(refuse("a tensor needs a name".to_string()));
        }
        if name.starts_with(RESERVED_PREFIX) {
            return Err(refuse(format!("names starting with `{RESERVED_PREFIX}` are reserved by the weights format")));
        }
        if self.tensor_names.contains(name) {
            return Err(refuse("added twice".to_string()));
        }
        let expected_bytes =
            byte_len(dtype, shape).ok_or_else(|| refuse(format!("shape {shape:?} of {dtype} overflows")))? as u64;
        let layout = layout.map(|value| serde_json::to_string(value).expect("JSON values always serialise"));

        self.align_data()?;
        let begin = self.data_len;
        let mut sink = TensorSink { out: &mut self.data, remaining_bytes: expected_bytes };
        let outcome = match write(&mut sink) {
            Ok(()) if sink.remaining_bytes == 0 => Ok(()),
            Ok(()) => Err(refuse(format!(
                "{} bytes written, but {dtype} × {shape:?} is {expected_bytes} bytes",
                expected_bytes - sink.remaining_bytes
            ))),
            Err(e) => Err(refuse(format!("writing its bytes failed: {e}"))),
        };
        if let Err(error) = outcome {
            self.rewind_data(begin)?;
            return Err(error);
        }
        self.data_len = begin + expected_bytes;
        self.entries.push(HeaderEntry {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
            data_offsets: [begin, self.data_len],
            layout,
        });
        self.tensor_names.insert(name.to_string());
        Ok(())
    }

    /// Whether a tensor called `name` has been added.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensor_names.contains(name)
    }

    /// Makes the manifest carry `drafter` (its tensors are added like the decoder's).
    pub fn set_drafter(&mut self, drafter: Drafter) {
        self.drafter = Some(drafter);
    }

    /// Adds a file with these bytes at `rel_path` (`/`-separated, inside the bundle).
    pub fn add_file(&mut self, rel_path: &str, bytes: &[u8]) -> Result<(), BundleError> {
        self.write_file(rel_path, |out| out.write_all(bytes))
    }

    /// Adds a copy of the file at `source` at `rel_path`, streamed.
    pub fn copy_file(&mut self, rel_path: &str, source: impl AsRef<Path>) -> Result<(), BundleError> {
        let source = source.as_ref();
        let mut input = File::open(source).map_err(|e| BundleError::io(source, e))?;
        self.write_file(rel_path, |out| copy_stream(&mut input, out).map(|_| ()))
    }

    /// Writes the weights file, then `manifest.json` (through a temporary file and a rename, after
    /// everything else is on disk), and returns what the bundle holds.
    pub fn finish(mut self) -> Result<BundleSummary, BundleError> {
        let weights_path = self.dir.join(WEIGHTS_FILE);
        self.data.flush().map_err(|e| BundleError::io(&self.data_path, e))?;
        let header = encode_header_padded(&self.entries, HEADER_RESERVE_BYTES as usize);
        let (blake3, size_bytes) =
            if header.len() as u64 == HEADER_RESERVE_BYTES && self.data_len >= COMPACT_BELOW_BYTES {
                let data = self.data.get_mut();
                data.seek(SeekFrom::Start(0))
                    .and_then(|_| data.write_all(&header))
                    .map_err(|e| BundleError::io(&self.data_path, e))?;
                let digest = hash_whole(data, self.sync).map_err(|e| BundleError::io(&self.data_path, e))?;
                fs::rename(&self.data_path, &weights_path).map_err(|e| BundleError::io(&weights_path, e))?;
                digest
            } else {
                self.write_compacted(&weights_path)?;
                let written = File::open(&weights_path).map_err(|e| BundleError::io(&weights_path, e))?;
                digest_of_file(&written).map_err(|e| BundleError::io(&weights_path, e))?
            };
        self.files.insert(WEIGHTS_FILE.to_string(), FileEntry { path: WEIGHTS_FILE.to_string(), size_bytes, blake3 });

        let files: Vec<FileEntry> = self.files.values().cloned().collect();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            compiler_version: self.header.compiler_version.clone(),
            target: self.header.target,
            model: self.header.model.clone(),
            program: self.header.program.clone(),
            drafter: self.drafter.clone(),
            files: files.clone(),
        };
        let manifest_bytes = manifest.encode();
        let temp_path = self.dir.join(MANIFEST_TEMP_FILE);
        let mut temp = File::create(&temp_path).map_err(|e| BundleError::io(&temp_path, e))?;
        temp.write_all(&manifest_bytes)
            .and_then(|()| if self.sync { temp.sync_all() } else { Ok(()) })
            .map_err(|e| BundleError::io(&temp_path, e))?;
        let manifest_path = self.dir.join(MANIFEST_FILE);
        fs::rename(&temp_path, &manifest_path).map_err(|e| BundleError::io(&manifest_path, e))?;
        // Makes the rename itself durable; not every platform can open a directory for this.
        if let Some(dir) = File::open(&self.dir).ok().filter(|_| self.sync) {
            let _ = dir.sync_all();
        }

        let total_bytes = files.iter().map(|entry| entry.size_bytes).sum::<u64>() + manifest_bytes.len() as u64;
        Ok(BundleSummary {
            dir: self.dir.clone(),
            target: self.header.target,
            files,
            tensors: self.tensor_names.len(),
            total_bytes,
        })
    }

    /// Writes the weights file anew: the header at its own size, then the tensor data copied from
    /// the partial file, which is removed.
    fn write_compacted(&mut self, weights_path: &Path) -> Result<(), BundleError> {
        let header = encode_header(&self.entries);
        let data = self.data.get_mut();
        data.seek(SeekFrom::Start(HEADER_RESERVE_BYTES)).map_err(|e| BundleError::io(&self.data_path, e))?;
        let mut output = File::create(weights_path).map_err(|e| BundleError::io(weights_path, e))?;
        output.write_all(&header).map_err(|e| BundleError::io(weights_path, e))?;
        let copied_bytes = copy_stream(data, &mut output).map_err(|e| BundleError::io(weights_path, e))?;
        if copied_bytes != self.data_len {
            let problem = format!("{copied_bytes} bytes of tensor data read back, {} written", self.data_len);
            return Err(BundleError::io(&self.data_path, io::Error::new(io::ErrorKind::UnexpectedEof, problem)));
        }
        if self.sync {
            output.sync_all().map_err(|e| BundleError::io(weights_path, e))?;
        }
        fs::remove_file(&self.data_path).map_err(|e| BundleError::io(&self.data_path, e))
    }

    /// Pads the data to the next multiple of [`ALIGNMENT_BYTES`] with a zero-filled `U8` filler
    /// entry, so the next tensor starts aligned and the data section stays contiguous.
    fn align_data(&mut self) -> Result<(), BundleError> {
        let gap_bytes = (ALIGNMENT_BYTES as u64 - self.data_len % ALIGNMENT_BYTES as u64) % ALIGNMENT_BYTES as u64;
        if gap_bytes == 0 {
            return Ok(());
        }
        self.data
            .write_all(&[0u8; ALIGNMENT_BYTES][..gap_bytes as usize])
            .map_err(|e| BundleError::io(&self.data_path, e))?;
        self.entries.push(HeaderEntry {
            name: format!("{PADDING_PREFIX}{}", self.fillers),
            dtype: Dtype::U8,
            shape: vec![gap_bytes as usize],
            data_offsets: [self.data_len, self.data_len + gap_bytes],
            layout: None,
        });
        self.fillers += 1;
        self.data_len += gap_bytes;
        Ok(())
    }

    /// Drops everything written after `len` bytes of tensor data.
    fn rewind_data(&mut self, len: u64) -> Result<(), BundleError> {
        let io_error = |e| BundleError::io(&self.data_path, e);
        self.data.flush().map_err(io_error)?;
        let file = self.data.get_mut();
        file.set_len(HEADER_RESERVE_BYTES + len).map_err(io_error)?;
        file.seek(SeekFrom::Start(HEADER_RESERVE_BYTES + len)).map_err(io_error)?;
        Ok(())
    }

    fn write_file(
        &mut self,
        rel_path: &str,
        write: impl FnOnce(&mut HashingWriter<File>) -> io::Result<()>,
    ) -> Result<(), BundleError> {
        check_relative_path(rel_path)?;
        let refuse =
            |problem: &str| BundleError::InvalidFile { file: rel_path.to_string(), problem: problem.to_string() };
        if [MANIFEST_FILE, WEIGHTS_FILE, DATA_TEMP_FILE, MANIFEST_TEMP_FILE].contains(&rel_path) {
            return Err(refuse("is a name the bundle writer uses itself"));
        }
        if self.files.contains_key(rel_path) {
            return Err(refuse("added twice"));
        }
        let path = self.dir.join(rel_path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| BundleError::io(parent, e))?;
        }
        let file =
            OpenOptions::new().write(true).create_new(true).open(&path).map_err(|e| BundleError::io(&path, e))?;
        let mut out = HashingWriter::new(file);
        write(&mut out).map_err(|e| BundleError::io(&path, e))?;
        let (file, blake3, size_bytes) = out.finish();
        if self.sync {
            file.sync_all().map_err(|e| BundleError::io(&path, e))?;
        }
        self.files.insert(rel_path.to_string(), FileEntry { path: rel_path.to_string(), size_bytes, blake3 });
        Ok(())
    }
}

impl Drop for BundleWriter {
    fn drop(&mut self) {
        // After `finish` the file is gone already; before it, the partial data is useless.
        let _ = fs::remove_file(&self.data_path);
    }
}

/// Where [`BundleWriter::add_tensor_with`] writes a tensor's bytes. Writing more than the tensor
/// holds is an error.
pub struct TensorSink<'a> {
    out: &'a mut BufWriter<File>,
    remaining_bytes: u64,
}

impl Write for TensorSink<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if bytes.len() as u64 > self.remaining_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} bytes more than dtype × shape", bytes.len() as u64 - self.remaining_bytes),
            ));
        }
        let n = self.out.write(bytes)?;
        self.remaining_bytes -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Copies `input` to `output` through one large buffer; returns the byte count.
fn copy_stream(input: &mut impl Read, output: &mut impl Write) -> io::Result<u64> {
    let mut buffer = vec![0u8; HASH_BUFFER_BYTES];
    let mut copied_bytes = 0u64;
    loop {
        let n = match input.read(&mut buffer) {
            Ok(0) => return Ok(copied_bytes),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        output.write_all(&buffer[..n])?;
        copied_bytes += n as u64;
    }
}

/// Makes `dir` an empty directory, replacing an existing bundle only when `overwrite` is set.
fn prepare_directory(dir: &Path, overwrite: bool) -> Result<(), BundleError> {
    match fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return fs::create_dir_all(dir).map_err(|e| BundleError::io(dir, e));
        }
        Err(e) => return Err(BundleError::io(dir, e)),
        Ok(metadata) if !metadata.is_dir() => {
            return Err(BundleError::io(
                dir,
                io::Error::new(io::ErrorKind::AlreadyExists, "exists and is not a directory"),
            ));
        }
        Ok(_) => {}
    }
    let is_empty = fs::read_dir(dir).map_err(|e| BundleError::io(dir, e))?.next().is_none();
    if is_empty {
        return Ok(());
    }
    if !overwrite {
        return Err(BundleError::DirectoryNotEmpty { dir: dir.to_path_buf() });
    }
    let is_bundle = [MANIFEST_FILE, WEIGHTS_FILE, DATA_TEMP_FILE].iter().any(|name| dir.join(name).exists());
    if !is_bundle {
        return Err(BundleError::NotABundle { dir: dir.to_path_buf() });
    }
    fs::remove_dir_all(dir).map_err(|e| BundleError::io(dir, e))?;
    fs::create_dir_all(dir).map_err(|e| BundleError::io(dir, e))
}

/// The BLAKE3 and size of the whole of `file`, read back from the page cache. With `sync`, it is
/// hashed on other threads while this one waits for the file to reach the disk, so the hash and
/// the sync overlap instead of adding up.
fn hash_whole(file: &File, sync: bool) -> io::Result<(String, u64)> {
    if !sync {
        return digest_of_file(file);
    }
    std::thread::scope(|scope| {
        let hashing = scope.spawn(|| digest_of_file(file));
        let synced = file.sync_all();
        let digest = hashing.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        synced.and(digest)
    })
}
