//! The GPU control files' ioctl structs, decoded from whatever bytes a caller hands the kernel.

use std::mem::size_of;

use ktfs::gpu::abi::{
    self, AbiError, Command, KtGpuBuffers, KtGpuStatus, KtGpuWindow, ABI_VERSION, BATCH,
    KT_GPU_GET, KT_GPU_JOIN, KT_GPU_PUT, KT_GPU_STATUS, MAGIC,
};

/// The first byte picks the command (one of the four, or the raw number in the next four
/// bytes); with its top bit set, the bytes are cut or padded to the command's size, so that
/// the field decoders see most inputs. What decodes must be the bytes' fields exactly
/// (re-encoding gives the input back), and every refusal names the right reason.
pub fn gpu_ioctl(input: &[u8]) {
    let Some((&pick, rest)) = input.split_first() else {
        return;
    };
    status_holds(rest);
    let (cmd, rest) = match pick % 5 {
        0 => (KT_GPU_PUT, rest),
        1 => (KT_GPU_GET, rest),
        2 => (KT_GPU_JOIN, rest),
        3 => (KT_GPU_STATUS, rest),
        _ if rest.len() >= 4 => (
            u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]),
            &rest[4..],
        ),
        _ => return,
    };
    let want = match cmd {
        KT_GPU_PUT | KT_GPU_GET => Some(size_of::<KtGpuBuffers>()),
        KT_GPU_JOIN => Some(size_of::<KtGpuWindow>()),
        KT_GPU_STATUS => Some(size_of::<KtGpuStatus>()),
        _ => None,
    };
    let mut data = rest.to_vec();
    if pick & 0x80 != 0 {
        data.resize(want.unwrap_or(((cmd >> 16) & 0x3fff) as usize), 0);
    }
    let got = abi::decode(cmd, &data);
    let Some(want) = want else {
        let ours = (cmd >> 8) & 0xff == u32::from(MAGIC);
        match got {
            Err(AbiError::BadCommand(c)) if ours && c == cmd => {}
            Err(AbiError::Foreign(c)) if !ours && c == cmd => {}
            other => panic!("command {cmd:#x}: {other:?}"),
        }
        return;
    };
    if data.len() != want {
        assert!(
            matches!(got, Err(AbiError::Size { got, want: w, .. }) if got == data.len() && w == want),
            "{} bytes for a {want}-byte struct: {got:?}",
            data.len()
        );
        return;
    }
    match got {
        Ok(Command::Put(b)) => {
            assert_eq!(cmd, KT_GPU_PUT);
            buffers_hold(&b, &data);
        }
        Ok(Command::Get(b)) => {
            assert_eq!(cmd, KT_GPU_GET);
            buffers_hold(&b, &data);
        }
        Ok(Command::Join(w)) => {
            assert_eq!(cmd, KT_GPU_JOIN);
            assert_eq!(w.version, ABI_VERSION);
            assert_eq!(
                encode_window(&w),
                data,
                "the window's fields are not its bytes"
            );
            for (field, what) in [(&w.group_id[..], "group_id"), (&w.ips[..], "ips")] {
                if let Ok(t) = abi::text(field, what) {
                    assert!(!t.contains('\0'), "{what}: text with a NUL");
                    assert!(
                        field.starts_with(t.as_bytes()),
                        "{what}: text not its bytes"
                    );
                }
            }
        }
        Ok(Command::Status(t)) => {
            assert_eq!(cmd, KT_GPU_STATUS);
            assert_eq!(t.to_le_bytes()[..], data[..8]);
        }
        Err(AbiError::Version(v)) => assert_ne!(v, ABI_VERSION),
        Err(AbiError::Count(n)) => assert!(n as usize > BATCH),
        Err(AbiError::Reserved) => assert!(data[12..16] != [0; 4]),
        Err(e) => panic!("{} bytes for command {cmd:#x}: {e:?}", data.len()),
    }
}

fn status_holds(rest: &[u8]) {
    // The status a caller reads back: fits, NUL-terminated, its text a prefix of the message.
    let message = String::from_utf8_lossy(rest);
    let s = KtGpuStatus {
        transfer: 1,
        state: abi::FAILED,
        error: -5,
        bytes_done: 0,
        bytes_total: 0,
        message: [0; 256],
    }
    .with_message(&message);
    let bytes = s.encode();
    assert_eq!(bytes.len(), size_of::<KtGpuStatus>());
    assert!(s.message.contains(&0), "a message without its NUL");
    let text = abi::text(&s.message, "message").expect("a message cut on a character boundary");
    assert!(
        message.starts_with(text),
        "the message is not a prefix of what was said"
    );
}

fn buffers_hold(b: &KtGpuBuffers, data: &[u8]) {
    assert_eq!(b.version, ABI_VERSION);
    assert!(b.count as usize <= BATCH);
    assert_eq!(b.reserved, 0);
    assert_eq!(
        encode_buffers(b),
        data,
        "the buffers' fields are not their bytes"
    );
}

/// The C layout, written here field by field, independent of the decoder.
fn encode_buffers(b: &KtGpuBuffers) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [b.version, b.flags, b.count, b.reserved] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for x in &b.buffers {
        out.extend_from_slice(&x.kind.to_le_bytes());
        out.extend_from_slice(&x.device.to_le_bytes());
        out.extend_from_slice(&x.entry.to_le_bytes());
        out.extend_from_slice(&x.reserved.to_le_bytes());
        out.extend_from_slice(&x.offset.to_le_bytes());
        out.extend_from_slice(&x.nbytes.to_le_bytes());
        out.extend_from_slice(&x.handle);
    }
    out
}

fn encode_window(w: &KtGpuWindow) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&w.version.to_le_bytes());
    out.extend_from_slice(&w.world_size.to_le_bytes());
    out.extend_from_slice(&w.timeout_ms.to_le_bytes());
    out.extend_from_slice(&w.fanout.to_le_bytes());
    out.extend_from_slice(&w.flags.to_le_bytes());
    out.extend_from_slice(&w.group_id);
    out.extend_from_slice(&w.ips);
    out
}
