//! What an export is, in the one word of its block that only the inspector reads: its kind,
//! the device that holds it, and whether importers may only read it. The owner writes it before
//! the block's generation makes the export live ([`Block::publish`](super::table::Block)); no
//! open reads it, so a peer that scribbles on it changes only what the inspector shows.

/// The kind of one export, as [`inspect`](crate::inspect) reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExportKind {
    /// An [`IpcBuffer`](crate::IpcBuffer) shared through the driver's legacy IPC handle.
    Legacy,
    /// An [`IpcBuffer`](crate::IpcBuffer) shared as virtual memory through a file descriptor.
    PosixFd,
    /// An allocation of an [`IpcPool`](crate::pool::IpcPool) (or an `IpcBuffer` of
    /// [`HandleType::Pool`](crate::HandleType::Pool)).
    Pool,
    /// A buffer of an [`IpcArena`](crate::arena::IpcArena).
    Arena,
    /// The slots of a [channel](crate::channel) (its producer exports them).
    Channel,
    /// The counter of an [`IpcSignal`](crate::IpcSignal) (a channel's signals included).
    Signal,
}

impl ExportKind {
    /// Every kind, in code order (code = index + 1; 0 is "no label").
    const ALL: [Self; 6] = [
        Self::Legacy,
        Self::PosixFd,
        Self::Pool,
        Self::Arena,
        Self::Channel,
        Self::Signal,
    ];

    /// The kind's name, as the inspector's tree and JSON print it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Legacy => "legacy",
            Self::PosixFd => "fd",
            Self::Pool => "pool",
            Self::Arena => "arena",
            Self::Channel => "channel",
            Self::Signal => "signal",
        }
    }

    fn code(self) -> u64 {
        Self::ALL
            .iter()
            .position(|k| *k == self)
            .map_or(0, |i| i as u64 + 1)
    }
}

impl std::fmt::Display for ExportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bit 8 of the word: importers may only read the export.
const READ_ONLY: u64 = 1 << 8;

/// One export's label: kind in the low byte, read-only in bit 8, the first 4 bytes of its
/// device's UUID in the high 32 bits (what `nvidia-smi -L` prints first, `GPU-xxxxxxxx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Label {
    pub(crate) kind: ExportKind,
    /// The device's UUID's first 4 bytes.
    pub(crate) device: [u8; 4],
    pub(crate) read_only: bool,
}

impl Label {
    /// A label for tests of the protocol, which never read it.
    #[cfg(any(test, fuzzing, cuda_ipc_test_hooks, cuda_ipc_loom))]
    pub(crate) const FOR_TESTS: Self = Self {
        kind: ExportKind::Arena,
        device: [0; 4],
        read_only: false,
    };

    /// The label of an export of `kind` on the device whose UUID is `uuid`.
    pub(crate) fn new(kind: ExportKind, uuid: &[u8; 16], read_only: bool) -> Self {
        Self {
            kind,
            device: [uuid[0], uuid[1], uuid[2], uuid[3]],
            read_only,
        }
    }

    /// The word a block keeps.
    pub(crate) fn word(self) -> u64 {
        let flags = if self.read_only { READ_ONLY } else { 0 };
        self.kind.code() | flags | (u64::from(u32::from_be_bytes(self.device)) << 32)
    }

    /// A block's word read back; `None` for a kind this crate never writes (a block published
    /// without a label, or a scribbled word).
    pub(crate) fn of_word(word: u64) -> Option<Self> {
        let code = word & 0xff;
        let kind = *ExportKind::ALL.get(usize::try_from(code).ok()?.checked_sub(1)?)?;
        Some(Self {
            kind,
            device: ((word >> 32) as u32).to_be_bytes(),
            read_only: word & READ_ONLY != 0,
        })
    }

    /// The device as `nvidia-smi -L` begins its UUID: `GPU-` and 8 hex digits.
    pub(crate) fn device_name(&self) -> String {
        let [a, b, c, d] = self.device;
        format!("GPU-{a:02x}{b:02x}{c:02x}{d:02x}")
    }
}

#[cfg(all(test, not(cuda_ipc_loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_label_reads_back_as_written() {
        let uuid = [0x4a, 0x3b, 0x00, 0xff, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9];
        for kind in ExportKind::ALL {
            for read_only in [false, true] {
                let label = Label::new(kind, &uuid, read_only);
                assert_eq!(Label::of_word(label.word()), Some(label), "{kind}");
                assert_eq!(label.device_name(), "GPU-4a3b00ff");
            }
        }
    }

    #[test]
    fn an_unlabelled_or_scribbled_word_is_no_label() {
        assert_eq!(Label::of_word(0), None, "a block published without a label");
        assert_eq!(Label::of_word(7), None, "a code past the last kind");
        assert_eq!(Label::of_word(u64::MAX), None);
        let signal = Label::of_word(6 | READ_ONLY).unwrap();
        assert_eq!(signal.kind, ExportKind::Signal);
        assert!(signal.read_only);
        assert_eq!(signal.device_name(), "GPU-00000000");
    }
}
