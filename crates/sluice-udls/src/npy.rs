//! Minimal `.npy` (NumPy array file) support for f32 tensors: enough to
//! take model inputs in the format NumPy users already have.

/// Parses a little-endian f32 `.npy` buffer into (shape, values).
pub fn parse_f32(buf: &[u8]) -> Result<(Vec<usize>, Vec<f32>), String> {
    if buf.len() < 10 || &buf[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let major = buf[6];
    let (hlen, start) = match major {
        1 => (u16::from_le_bytes([buf[8], buf[9]]) as usize, 10),
        2 | 3 => {
            if buf.len() < 12 {
                return Err(".npy header truncated".into());
            }
            (
                u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize,
                12,
            )
        }
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = buf
        .get(start..start + hlen)
        .ok_or(".npy header truncated")?;
    let header = std::str::from_utf8(header).map_err(|_| ".npy header is not text")?;
    let field = |name: &str| -> Option<&str> {
        let i = header.find(&format!("'{name}'"))?;
        Some(
            header[i + name.len() + 2..]
                .trim_start()
                .trim_start_matches(':')
                .trim_start(),
        )
    };
    let descr = field("descr").ok_or("npy header has no descr")?;
    if !(descr.starts_with("'<f4'") || descr.starts_with("'float32'")) {
        return Err(format!(
            "npy dtype {} is not little-endian float32 ('<f4')",
            descr.split(',').next().unwrap_or("?")
        ));
    }
    if field("fortran_order").is_some_and(|f| f.starts_with("True")) {
        return Err("fortran-ordered .npy arrays are not supported".into());
    }
    let shape_s = field("shape").ok_or("npy header has no shape")?;
    let inner = shape_s
        .trim_start_matches('(')
        .split(')')
        .next()
        .unwrap_or("");
    let shape: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("bad npy shape {shape_s}"))
        })
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let data = &buf[start + hlen..];
    if data.len() != n * 4 {
        return Err(format!(
            "npy data is {} bytes, shape {shape:?} needs {}",
            data.len(),
            n * 4
        ));
    }
    let values = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((shape, values))
}

/// Writes an f32 `.npy` (version 1.0).
pub fn write_f32(shape: &[usize], values: &[f32]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_s = if shape.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_s}, }}");
    // Pad so data starts on a 64-byte boundary, header ends with '\n'.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_errors() {
        let b = write_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            parse_f32(&b).unwrap(),
            (vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        );
        let b1 = write_f32(&[4], &[1.0; 4]);
        assert_eq!(parse_f32(&b1).unwrap().0, vec![4]);
        assert!(parse_f32(b"hello world").unwrap_err().contains("magic"));
        let mut short = b.clone();
        short.truncate(b.len() - 4);
        assert!(parse_f32(&short).unwrap_err().contains("needs"));
        let f8 = String::from_utf8_lossy(&b)
            .replace("<f4", "<f8")
            .into_bytes();
        assert!(parse_f32(&f8).is_err());
    }
}
