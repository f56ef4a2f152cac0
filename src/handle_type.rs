//! [`HandleType`]: how a buffer's memory is shared with other processes, and the code an
//! envelope carries for it. A leaf: it names nothing of the crate, so the error types that
//! mention it (and everything below them) do not depend on the handle that carries it.

/// How an [`IpcBuffer`](crate::IpcBuffer)'s memory is shared with other processes: chosen when
/// the buffer is allocated ([`IpcBuffer::new_with`](crate::IpcBuffer::new_with)).
///
/// | | [`Legacy`](Self::Legacy) | [`PosixFd`](Self::PosixFd) | [`Pool`](Self::Pool) |
/// |-|-|-|-|
/// | Allocation | `cuMemAlloc` | `cuMemCreate` + `cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess` | `cuMemAllocFromPoolAsync` from a pool this process keeps per context, synchronised |
/// | What a peer needs | the 184-byte [`IpcMemHandle`](crate::IpcMemHandle) (any channel) | the handle **and** a file descriptor, sent over an [`FdSocket`](crate::fd::FdSocket) | the pool's handle and descriptor and the buffer's [`PoolHandle`](crate::pool::PoolHandle), sent over an [`FdSocket`](crate::fd::FdSocket) ([`send_buffer`](crate::fd::FdSocket::send_buffer)) |
/// | What a peer's open costs | a mapping per buffer | a mapping per buffer | the pool's import once per process, then `cuMemPoolImportPointer` per buffer |
/// | Who can map it | anyone who reads the handle bytes (a bearer token; any uid, any pid namespace) | only a process the descriptor was sent to (a capability) | only a process the pool's descriptor was sent to |
/// | Dropping the exporter while mapped elsewhere | never waits: the free is deferred until the last importer unmaps or dies (leases) | never waits: the driver keeps the memory while any process maps it | never waits: the allocation is quarantined until its importers free their imports or die |
/// | Opening in the exporting process | refused (CUDA cannot) | allowed | allowed |
/// | Foreign peers ([`IpcBuffer::raw_export`](crate::IpcBuffer::raw_export)) | yes (PyTorch, CuPy, C/C++) | no | no |
///
/// [`Auto`](Self::Auto) picks [`PosixFd`](Self::PosixFd) where the device supports it
/// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED` and virtual memory
/// management), else [`Legacy`](Self::Legacy);
/// [`IpcBuffer::handle_type`](crate::IpcBuffer::handle_type) says which. (It never picks
/// [`Pool`](Self::Pool): a pool buffer has no single handle, and POSIX-fd buffers give the same
/// capability without a pool.) [`FdSocket::send_buffer`](crate::fd::FdSocket::send_buffer) and
/// [`recv_buffer`](crate::fd::FdSocket::recv_buffer) carry every kind, so code that passes buffers
/// over a socket works with all three.
///
/// For many buffers to one peer, [`Pool`](Self::Pool) makes each open after the first cheap (no
/// mapping: 1.1 µs on an H200 against 60–70 µs), as an [`IpcArena`](crate::arena::IpcArena) does
/// without any driver call; an [`IpcPool`](crate::pool::IpcPool) gives the pool itself to the
/// caller (stream-ordered allocation and free, handles sent the caller's way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HandleType {
    /// CUDA's legacy IPC handles (`cuIpcGetMemHandle`): 64 bytes that map the memory anywhere.
    #[default]
    Legacy,
    /// Virtual-memory allocations exported as POSIX file descriptors
    /// (`cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)`).
    PosixFd,
    /// [`PosixFd`](Self::PosixFd) where the device allows it, else [`Legacy`](Self::Legacy).
    Auto,
    /// An allocation from a stream-ordered pool exported as a POSIX file descriptor
    /// (`cuMemPoolCreate`, `cuMemAllocFromPoolAsync`, `cuMemPoolExportPointer`): the memory
    /// cudarc and other stream-ordered code allocate, which legacy handles refuse. The `Pool`
    /// buffers of a context share one pool (another once it is full), kept while any of them
    /// lives; a peer imports it once ([`FdSocket::recv_buffer`](crate::fd::FdSocket::recv_buffer)
    /// shares the import) and then each buffer with `cuMemPoolImportPointer`. The pool is the
    /// unit of trust: a peer sent one `Pool` buffer holds the pool, and should be assumed able
    /// to open every buffer in it (SECURITY.md); what one peer alone may see belongs in an
    /// [`IpcPool`](crate::pool::IpcPool) of its own or a [`PosixFd`](Self::PosixFd) buffer.
    Pool,
}

impl HandleType {
    /// The envelope's code for a concrete type (`Auto` is resolved before export).
    pub(crate) fn code(self) -> u32 {
        match self {
            Self::Legacy | Self::Auto => HANDLE_LEGACY,
            Self::PosixFd => HANDLE_POSIX_FD,
            // Never in a memory envelope (a pool buffer travels as a pool handle and a pool
            // buffer handle); a code no envelope parses, should one be sealed with it.
            Self::Pool => HANDLE_POOL_UNUSED,
        }
    }

    /// The type an envelope's code names (`None` for a code no envelope may carry).
    pub(crate) fn from_code(code: u32) -> Option<Self> {
        match code {
            HANDLE_LEGACY => Some(Self::Legacy),
            HANDLE_POSIX_FD => Some(Self::PosixFd),
            _ => None,
        }
    }
}

impl std::fmt::Display for HandleType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Legacy => "legacy IPC",
            Self::PosixFd => "POSIX file descriptor",
            Self::Auto => "automatic",
            Self::Pool => "stream-ordered pool",
        })
    }
}

/// Envelope codes of [`HandleType`]s.
const HANDLE_LEGACY: u32 = 0;
const HANDLE_POSIX_FD: u32 = 1;
/// Never valid in an envelope (see [`HandleType::code`]).
const HANDLE_POOL_UNUSED: u32 = u32::MAX;
