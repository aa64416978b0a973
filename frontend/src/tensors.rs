//! TensorProto → bytes, with external data resolved safely.
//!
//! External data is read only from regular files inside the model's folder: locations that are
//! absolute, contain `..`, or resolve (through symlinks) outside the folder are refused, as are
//! offsets and lengths outside the file and sizes that disagree with the tensor's shape. Files are
//! memory-mapped once and tensors are slices of the mapping.

use crate::error::ErrorKind;
use crate::proto::TensorProto;
use bytes::Bytes;
use ir::DType;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// Largest element count npuc accepts for one tensor (2^40); a guard against dims that would make
/// size arithmetic meaningless, not a memory budget (data is never allocated from dims alone).
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;

/// Memory maps of the external data files a model uses, opened on first use.
pub struct ExternalFiles {
    dir: PathBuf,
    canonical_dir: Option<PathBuf>,
    maps: HashMap<PathBuf, Bytes>,
    /// SHA-1 digests (lowercase hex) of the files a `checksum` entry named, computed once each.
    digests: HashMap<String, String>,
}

/// A decoded tensor: type, concrete shape and little-endian bytes in `raw_data` layout.
pub struct RawTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Bytes,
}

impl ExternalFiles {
    pub fn new(model_dir: &Path) -> ExternalFiles {
        ExternalFiles {
            dir: model_dir.to_path_buf(),
            canonical_dir: None,
            maps: HashMap::new(),
            digests: HashMap::new(),
        }
    }

    fn open(&mut self, tensor: &str, location: &str) -> Result<Bytes, ErrorKind> {
        let err = |detail: String| ErrorKind::ExternalData { tensor: tensor.into(), file: location.into(), detail };
        let rel = Path::new(location);
        if location.is_empty() {
            return Err(err("the location is empty".into()));
        }
        if rel.is_absolute() || location.starts_with('/') || location.starts_with('\\') || location.contains(':') {
            return Err(err("absolute locations are refused; external data must live in the model's folder".into()));
        }
        for c in rel.components() {
            match c {
                Component::Normal(_) | Component::CurDir => {}
                Component::ParentDir => {
                    return Err(
                        err("`..` components are refused; external data must live in the model's folder".into()),
                    )
                }
                _ => return Err(err("the location is not a plain relative path".into())),
            }
        }
        let joined = self.dir.join(rel);
        if let Some(b) = self.maps.get(&joined) {
            return Ok(b.clone());
        }
        if self.canonical_dir.is_none() {
            let d =
                std::fs::canonicalize(&self.dir).map_err(|e| err(format!("cannot resolve the model's folder: {e}")))?;
            self.canonical_dir = Some(d);
        }
        let canonical_dir = self.canonical_dir.as_ref().expect("set above");
        let canonical = std::fs::canonicalize(&joined).map_err(|e| err(format!("cannot open: {e}")))?;
        if !canonical.starts_with(canonical_dir) {
            return Err(err("it resolves (through a symlink) to a file outside the model's folder; refused".into()));
        }
        let file = std::fs::File::open(&canonical).map_err(|e| err(format!("cannot open: {e}")))?;
        let meta = file.metadata().map_err(|e| err(format!("cannot stat: {e}")))?;
        if !meta.is_file() {
            return Err(err("not a regular file".into()));
        }
        let bytes = if meta.len() == 0 {
            Bytes::new()
        } else {
            // SAFETY: the mapping is read-only; npuc does not modify model files while importing.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(format!("cannot map: {e}")))?;
            Bytes::from_owner(map)
        };
        self.maps.insert(joined, bytes.clone());
        Ok(bytes)
    }
}

/// The dtype and shape of a TensorProto, checked: known type, non-negative dims, element count
/// below [`MAX_TENSOR_ELEMENTS`] without overflow.
pub fn tensor_type(t: &TensorProto) -> Result<(DType, Vec<usize>, u64), ErrorKind> {
    let name = t.name.clone().unwrap_or_default();
    let code = t.data_type.unwrap_or(0);
    let dtype = DType::from_onnx_code(code)
        .ok_or_else(|| ErrorKind::Tensor { tensor: name.clone(), detail: format!("unknown data type code {code}") })?;
    let mut numel: u64 = 1;
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(ErrorKind::Tensor { tensor: name, detail: format!("negative dimension {d} in {:?}", t.dims) });
        }
        numel = numel.checked_mul(d as u64).filter(|&n| n <= MAX_TENSOR_ELEMENTS).ok_or_else(|| ErrorKind::Tensor {
            tensor: name.clone(),
            detail: format!("shape {:?} has more than 2^40 elements", t.dims),
        })?;
        shape.push(d as usize);
    }
    Ok((dtype, shape, numel))
}

/// Decodes a TensorProto's payload (raw, typed fields or external) into `raw_data` layout.
pub fn decode_tensor(t: &TensorProto, files: &mut ExternalFiles) -> Result<RawTensor, ErrorKind> {
    let name = t.name.clone().unwrap_or_default();
    let (dtype, shape, numel) = tensor_type(t)?;
    let terr = |detail: String| ErrorKind::Tensor { tensor: name.clone(), detail };
    if dtype == DType::Str || dtype == DType::C64 || dtype == DType::C128 {
        return Err(terr(format!("{dtype} tensors are not supported")));
    }
    let expected = dtype.storage_bytes(numel).expect("numel is bounded by 2^40");
    if t.segment.is_some() {
        return Err(terr("segmented tensors are not supported".into()));
    }
    if t.data_location == Some(crate::proto::tensor_proto::DataLocation::External as i32) {
        let mut location = None;
        let mut offset: u64 = 0;
        let mut length: Option<u64> = None;
        let mut checksum: Option<String> = None;
        for e in &t.external_data {
            let value = e.value.clone().unwrap_or_default();
            let parse = |what: &str| {
                value.parse::<u64>().map_err(|_| ErrorKind::ExternalData {
                    tensor: name.clone(),
                    file: location_name(&t.external_data),
                    detail: format!("{what} `{value}` is not a non-negative integer"),
                })
            };
            match e.key.as_deref() {
                Some("location") => location = Some(value.clone()),
                Some("offset") => offset = parse("offset")?,
                Some("length") => length = Some(parse("length")?),
                Some("checksum") => checksum = Some(value.trim().to_ascii_lowercase()),
                _ => {}
            }
        }
        let location = location.ok_or_else(|| terr("external data without a location".into()))?;
        let file = files.open(&name, &location)?;
        let ext = |detail: String| ErrorKind::ExternalData { tensor: name.clone(), file: location.clone(), detail };
        if let Some(want) = checksum {
            let got = files.digests.entry(location.clone()).or_insert_with(|| sha1_hex(&file));
            if *got != want {
                return Err(ext(format!("the file's SHA-1 is {got}, its checksum entry says {want}")));
            }
        }
        let file_len = file.len() as u64;
        let length = length.unwrap_or(file_len.saturating_sub(offset));
        let end = offset.checked_add(length).ok_or_else(|| ext("offset + length overflows".into()))?;
        if end > file_len {
            return Err(ext(format!(
                "offset {offset} + length {length} is past the end of the file ({file_len} bytes)"
            )));
        }
        if length != expected {
            return Err(ext(format!("length {length} disagrees with {dtype}{shape:?}, which needs {expected} bytes")));
        }
        return Ok(RawTensor { dtype, shape, bytes: file.slice(offset as usize..end as usize) });
    }
    if let Some(raw) = &t.raw_data {
        if raw.len() as u64 != expected {
            return Err(terr(format!("raw_data has {} bytes but {dtype}{shape:?} needs {expected}", raw.len())));
        }
        return Ok(RawTensor { dtype, shape, bytes: raw.clone() });
    }
    let bytes = typed_fields_to_bytes(t, dtype, numel).map_err(|e| terr(e.to_string()))?;
    Ok(RawTensor { dtype, shape, bytes: Bytes::from(bytes) })
}

/// The SHA-1 digest of `bytes` as lowercase hex: what ONNX's external-data `checksum` entry holds
/// for the whole file its `location` names.
fn sha1_hex(bytes: &[u8]) -> String {
    use sha1::Digest;
    sha1::Sha1::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn location_name(entries: &[crate::proto::StringStringEntryProto]) -> String {
    entries.iter().find(|e| e.key.as_deref() == Some("location")).and_then(|e| e.value.clone()).unwrap_or_default()
}

/// Why a tensor's typed `*_data` fields do not hold its value.
#[derive(Debug, thiserror::Error)]
enum TypedFieldsError {
    #[error("{field} holds {found} values but {dtype}{dims:?} needs {want}")]
    Count { field: &'static str, found: usize, dtype: DType, dims: Vec<i64>, want: u64 },
    #[error("{0} tensors cannot be read from typed fields")]
    Unsupported(DType),
    #[error("the tensor has no data")]
    NoData,
}

/// Converts the typed `*_data` fields to `raw_data` layout, checking the element count.
fn typed_fields_to_bytes(t: &TensorProto, dtype: DType, numel: u64) -> Result<Vec<u8>, TypedFieldsError> {
    use DType::*;
    let count_err = |field: &'static str, found: usize, want: u64| TypedFieldsError::Count {
        field,
        found,
        dtype,
        dims: t.dims.clone(),
        want,
    };
    let mut out = Vec::new();
    match dtype {
        F32 => {
            if t.float_data.len() as u64 != numel {
                return Err(count_err("float_data", t.float_data.len(), numel));
            }
            t.float_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        F64 => {
            if t.double_data.len() as u64 != numel {
                return Err(count_err("double_data", t.double_data.len(), numel));
            }
            t.double_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        I64 => {
            if t.int64_data.len() as u64 != numel {
                return Err(count_err("int64_data", t.int64_data.len(), numel));
            }
            t.int64_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        U32 | U64 => {
            if t.uint64_data.len() as u64 != numel {
                return Err(count_err("uint64_data", t.uint64_data.len(), numel));
            }
            for v in &t.uint64_data {
                if dtype == U32 {
                    out.extend_from_slice(&(*v as u32).to_le_bytes());
                } else {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        I32 | I16 | U16 | I8 | U8 | Bool | F16 | BF16 | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 => {
            if t.int32_data.len() as u64 != numel {
                return Err(count_err("int32_data", t.int32_data.len(), numel));
            }
            let width = (dtype.bits() / 8) as usize;
            for v in &t.int32_data {
                out.extend_from_slice(&v.to_le_bytes()[..width]);
            }
        }
        I4 | U4 | F4E2M1 => {
            // Two 4-bit values per int32_data element, element 2k in the low nibble.
            let want = numel.div_ceil(2);
            if t.int32_data.len() as u64 != want {
                return Err(count_err("int32_data", t.int32_data.len(), want));
            }
            out.extend(t.int32_data.iter().map(|&v| v as u8));
        }
        I2 | U2 => {
            // Four 2-bit values per int32_data element, element 4k in the lowest bits.
            let want = numel.div_ceil(4);
            if t.int32_data.len() as u64 != want {
                return Err(count_err("int32_data", t.int32_data.len(), want));
            }
            out.extend(t.int32_data.iter().map(|&v| v as u8));
        }
        _ => return Err(TypedFieldsError::Unsupported(dtype)),
    }
    if out.is_empty() && numel > 0 {
        return Err(TypedFieldsError::NoData);
    }
    Ok(out)
}

/// Reads a file holding one serialized TensorProto (the layout of ONNX test data sets) and
/// returns its name and value. External data is not allowed here.
pub fn read_tensor_file(path: &Path) -> Result<(String, ir::Tensor), crate::Error> {
    use prost::Message;
    let bytes = std::fs::read(path).map_err(|e| ErrorKind::Io(e).at(path))?;
    let t = TensorProto::decode(Bytes::from(bytes)).map_err(|e| ErrorKind::Decode(e.to_string()).at(path))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut files = ExternalFiles::new(dir);
    let name = t.name.clone().unwrap_or_default();
    let raw = decode_tensor(&t, &mut files).map_err(|k| k.at(path))?;
    let tensor = ir::Tensor::from_le_bytes(raw.dtype, raw.shape, &raw.bytes)
        .map_err(|e| ErrorKind::Tensor { tensor: name.clone(), detail: e.to_string() }.at(path))?;
    Ok((name, tensor))
}

/// A test case: its inputs by name, and its expected outputs in graph output order.
pub type TestCase = (HashMap<String, ir::Tensor>, Vec<(String, ir::Tensor)>);

/// Reads an ONNX test-data folder: `input_<i>.pb` as named inputs and `output_<j>.pb` as
/// (name, tensor) in order, each file one serialized TensorProto.
pub fn read_test_case(dir: &Path) -> Result<TestCase, crate::Error> {
    let mut inputs = HashMap::new();
    let mut outputs = Vec::new();
    for i in 0.. {
        let p = dir.join(format!("input_{i}.pb"));
        if !p.exists() {
            break;
        }
        let (name, t) = read_tensor_file(&p)?;
        inputs.insert(name, t);
    }
    for i in 0.. {
        let p = dir.join(format!("output_{i}.pb"));
        if !p.exists() {
            break;
        }
        outputs.push(read_tensor_file(&p)?);
    }
    Ok((inputs, outputs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_bit_typed_fields_pack_four_values_per_int32() {
        // 180 = 0b10_11_01_00: from the lowest bits up the codes are 0, 1, 3 and 2, which int2
        // reads as 0, 1, -1 and -2.
        let t = TensorProto { data_type: Some(26), dims: vec![4], int32_data: vec![180], ..Default::default() };
        let raw = decode_tensor(&t, &mut ExternalFiles::new(Path::new("."))).unwrap();
        let tensor = ir::Tensor::from_le_bytes(raw.dtype, raw.shape, &raw.bytes).unwrap();
        assert_eq!(tensor.as_i64().unwrap(), &[0, 1, -1, -2]);
        let short = TensorProto { data_type: Some(25), dims: vec![5], int32_data: vec![1], ..Default::default() };
        let err = decode_tensor(&short, &mut ExternalFiles::new(Path::new("."))).err().unwrap();
        assert!(err.to_string().contains("needs 2"), "{err}");
    }
}
