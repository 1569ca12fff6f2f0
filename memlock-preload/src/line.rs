//! The log's lines, built on the stack: the hooks run inside the program's allocator and
//! may not allocate.

use std::ffi::c_int;

/// ` ok` or ` errno=N`, then the newline.
pub(crate) fn result(line: &mut LineBuf, ok: bool) {
    if ok {
        line.push(b" ok\n");
    } else {
        line.push(b" errno=");
        line.push_num(std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as u64);
        line.push(b"\n");
    }
}

/// A log line built on the stack.
pub(crate) struct LineBuf {
    buf: [u8; 128],
    len: usize,
}

impl LineBuf {
    pub(crate) fn new() -> Self {
        Self {
            buf: [0; 128],
            len: 0,
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    pub(crate) fn push_num(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    pub(crate) fn push_hex(&mut self, mut n: u64) {
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(n % 16) as usize];
            n /= 16;
            if n == 0 {
                break;
            }
        }
        self.push(b"0x");
        self.push(&digits[i..]);
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub(crate) fn write(&self, fd: c_int) {
        if fd >= 0 {
            // SAFETY: writes our own buffer; one write per line (O_APPEND keeps lines whole).
            unsafe { libc::write(fd, self.buf.as_ptr().cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_built_without_allocating() {
        let mut line = LineBuf::new();
        line.push(b"lock anon ");
        line.push_hex(0x7f00_1000);
        line.push(b" ");
        line.push_num(4096);
        assert_eq!(line.bytes(), b"lock anon 0x7f001000 4096");
    }
}
