//! The VFS of the store's writer: the store's VFS (`sql::SqliteFile`, the base),
//! except that a WAL file gets each commit's frames in one write instead of two
//! a frame.
//!
//! SQLite writes a WAL frame as two `pwrite` calls, its 24-byte header then its
//! page, so a commit of 10 pages makes 20 system calls, each paying the file
//! system's work for every page it touches (with one client, 11 % of the
//! daemon's CPU went to them). Here a WAL file keeps a run of contiguous writes
//! in memory and writes it as one once it has the page of the transaction's
//! commit frame (the frame whose header carries the database's size), before it
//! returns to SQLite: the error of that write is the commit frame's.
//!
//! Nothing committed is held back, and nothing held outlives its transaction. A
//! frame is visible to other connections (readers, the checkpoint) only once the
//! committing connection has published the commit in the WAL index, which it
//! does after writing the commit frame, so after this file wrote everything it
//! held. What SQLite writes after the commit frame and before the transaction's
//! WAL-index lock changes (frame headers whose checksums it rewrites when the
//! transaction wrote a page twice, padding frames under `synchronous = FULL`) is
//! written at once, and the database file's barrier, which comes before the
//! publication, writes anything still held (the tests check that nothing is).
//! Frames a transaction wrote before its commit (a page cache spilling) and
//! never committed are written before the connection changes a lock of the WAL
//! index (the database file's `xShmLock`), so before another connection may write
//! to the WAL. Anything else done to the WAL (a read, a sync, a truncation, its
//! size, a file control, closing it, a write that does not follow the last)
//! first writes what is held, so SQLite's writes land in the order it made them.
//! A crash while frames are held loses frames of a transaction that has not
//! committed, as a crash in the middle of SQLite's own writes would. Files other
//! than the database and its WAL are the base VFS's, untouched.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

use rusqlite::ffi;

use crate::store::sql::SqliteFile;

/// The names the VFS is registered under, over each of the store's base VFSes.
const NAMES: [&CStr; 2] = [c"troupe-wal", c"troupe-wal-shared"];

/// Where a base VFS's registration is kept ([`NAMES`], [`BASES`]).
fn slot(file: SqliteFile) -> usize {
    match file {
        SqliteFile::Exclusive => 0,
        SqliteFile::Shared => 1,
    }
}

/// The name of this VFS over the base VFS of `file` (registered by [`register`]).
pub(super) fn name(file: SqliteFile) -> &'static CStr {
    NAMES[slot(file)]
}

/// Bytes held at most: the base VFS writes at most 128 KiB - 1 at once (its
/// `seekAndWriteFd`), so a longer run of frames is written in pieces this long.
const MAX_HELD: usize = 0x1ffff;

/// The size of a WAL frame's header.
const FRAME_HEADER: c_int = 24;

/// A WAL file: what it holds, then the base VFS's file (at [`INNER`]).
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    held: Vec<u8>,
    /// The offset in the file of `held`'s first byte.
    start: i64,
    /// The last write was a commit frame's header: the next (its page) ends the
    /// transaction's frames.
    commit_page_next: bool,
    /// The transaction's commit frame is written: what SQLite writes until the
    /// WAL-index lock changes (its checksums rewritten in frame headers, padding)
    /// is written at once, since the commit may be published before any other
    /// call reaches this file.
    committed: bool,
    /// The database file of the same connection, which SQLite closes after this.
    database: *mut DatabaseFile,
}

/// A database file: its connection's WAL while it is open, then the base VFS's
/// file (at [`INNER`]).
#[repr(C)]
struct DatabaseFile {
    base: ffi::sqlite3_file,
    wal: *mut ffi::sqlite3_file,
}

/// Where the base VFS's file starts inside either file's allocation.
const INNER: usize = {
    let (wal, database) = (size_of::<WalFile>(), size_of::<DatabaseFile>());
    (if wal > database { wal } else { database }).next_multiple_of(16)
};

/// This VFS's `xOpen` over each base VFS, by [`slot`].
type Open = unsafe extern "C" fn(
    *mut ffi::sqlite3_vfs,
    ffi::sqlite3_filename,
    *mut ffi::sqlite3_file,
    c_int,
    *mut c_int,
) -> c_int;
const OPENS: [Open; 2] = [open::<0>, open::<1>];

/// The base VFSes this one wraps, by [`slot`] (their addresses: `sqlite3_vfs`
/// is not `Sync`).
static BASES: [OnceLock<usize>; 2] = [OnceLock::new(), OnceLock::new()];

/// Registers the VFS over the base VFS of `file` (once per process). Fails only
/// if SQLite lacks the base VFS.
pub(super) fn register(file: SqliteFile) -> Result<(), String> {
    static REGISTERED: [OnceLock<Result<(), String>>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = slot(file);
    REGISTERED[slot]
        .get_or_init(|| {
            let base_name = CString::new(file.vfs()).map_err(|error| error.to_string())?;
            // SAFETY: `sqlite3_vfs_find` returns a VFS built into SQLite, which
            // lives as long as the process; the VFS registered here is leaked, so
            // it does too, as SQLite requires. Its methods other than `xOpen` are
            // the base VFS's, which read nothing of the VFS they are given but
            // its `pAppData` and `mxPathname`, copied. (The base's `xOpen` is
            // given the base itself: `unix-excl` is told by its name.)
            unsafe {
                let base = ffi::sqlite3_vfs_find(base_name.as_ptr());
                if base.is_null() {
                    return Err(format!("SQLite has no VFS named {}", file.vfs()));
                }
                let mut vfs = *base;
                vfs.zName = NAMES[slot].as_ptr();
                vfs.pNext = ptr::null_mut();
                vfs.szOsFile = c_int::try_from(INNER).map_err(|error| error.to_string())? + (*base).szOsFile;
                vfs.xOpen = Some(OPENS[slot]);
                let _ = BASES[slot].set(base as usize);
                let code = ffi::sqlite3_vfs_register(Box::into_raw(Box::new(vfs)), 0);
                if code != ffi::SQLITE_OK {
                    return Err(format!("SQLite refused the store's VFS (code {code})"));
                }
                Ok(())
            }
        })
        .clone()
}

/// The base VFS's file inside `file`.
///
/// # Safety
/// `file` is a [`WalFile`] or [`DatabaseFile`] this VFS opened.
unsafe fn inner(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: the allocation is `szOsFile` bytes, `INNER` of them before the inner file.
    unsafe { file.cast::<u8>().add(INNER).cast() }
}

/// The base VFS's methods for the file inside `file`.
///
/// # Safety
/// As [`inner`]; the inner file is open.
unsafe fn methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: an open file's methods are static in the base VFS.
    unsafe { &*(*inner(file)).pMethods }
}

/// Opens a file over the base VFS of slot `SLOT`.
unsafe extern "C" fn open<const SLOT: usize>(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: `BASES[SLOT]` is the base VFS (registration set it before this VFS
    // could be used), and `file` has room for either file and its inner file.
    unsafe {
        let Some(&base) = BASES[SLOT].get() else { return ffi::SQLITE_CANTOPEN };
        let base = base as *mut ffi::sqlite3_vfs;
        let Some(base_open) = (*base).xOpen else { return ffi::SQLITE_CANTOPEN };
        let wal = flags & ffi::SQLITE_OPEN_WAL != 0;
        if !wal && flags & ffi::SQLITE_OPEN_MAIN_DB == 0 {
            // Neither: the base VFS's file, in place (the allocation is larger
            // than it needs).
            return base_open(base, name, file, flags, out_flags);
        }
        (*file).pMethods = ptr::null();
        let code = base_open(base, name, inner(file), flags, out_flags);
        if code != ffi::SQLITE_OK {
            // SQLite closes only files whose methods are set: ours are not.
            if let Some(close) = (*inner(file)).pMethods.as_ref().and_then(|methods| methods.xClose) {
                close(inner(file));
            }
            return code;
        }
        if (*inner(file)).pMethods.is_null() {
            return ffi::SQLITE_CANTOPEN;
        }
        if !wal {
            let database =
                DatabaseFile { base: ffi::sqlite3_file { pMethods: &DATABASE_METHODS }, wal: ptr::null_mut() };
            ptr::write(file.cast::<DatabaseFile>(), database);
            return code;
        }
        let mut database = ffi::sqlite3_database_file_object(name).cast::<DatabaseFile>();
        if !database.is_null() && ptr::eq((*database).base.pMethods, &DATABASE_METHODS) {
            (*database).wal = file;
        } else {
            database = ptr::null_mut();
        }
        let wal = WalFile {
            base: ffi::sqlite3_file { pMethods: &WAL_METHODS },
            held: Vec::new(),
            start: 0,
            commit_page_next: false,
            // A WAL with no database file of this VFS (none such is opened) is
            // never told that a transaction ended: it holds nothing.
            committed: database.is_null(),
            database,
        };
        ptr::write(file.cast::<WalFile>(), wal);
        code
    }
}

/// Writes what the WAL `file` holds.
///
/// # Safety
/// `file` is an open [`WalFile`].
unsafe fn write_held(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: per the contract; SQLite calls a connection's files one at a time.
    unsafe {
        let wal = &mut *file.cast::<WalFile>();
        if wal.held.is_empty() {
            return ffi::SQLITE_OK;
        }
        let Ok(length) = c_int::try_from(wal.held.len()) else { return ffi::SQLITE_IOERR_WRITE };
        let Some(write) = methods(file).xWrite else { return ffi::SQLITE_IOERR_WRITE };
        let code = write(inner(file), wal.held.as_ptr().cast(), length, wal.start);
        wal.held.clear();
        code
    }
}

/// Writes what the WAL of the database `file` holds, if it is open.
///
/// # Safety
/// `file` is an open [`DatabaseFile`].
unsafe fn write_held_wal(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: per the contract; its WAL is open while it is linked.
    unsafe {
        let wal = (*file.cast::<DatabaseFile>()).wal;
        if wal.is_null() { ffi::SQLITE_OK } else { write_held(wal) }
    }
}

unsafe extern "C" fn wal_write(file: *mut ffi::sqlite3_file, data: *const c_void, amount: c_int, offset: i64) -> c_int {
    // SAFETY: SQLite passes an open file of this VFS and `amount` readable bytes.
    unsafe {
        let Ok(length) = usize::try_from(amount) else { return ffi::SQLITE_IOERR_WRITE };
        let bytes = std::slice::from_raw_parts(data.cast::<u8>(), length);
        let wal = &mut *file.cast::<WalFile>();
        let follows = wal.start + wal.held.len() as i64 == offset;
        if !wal.held.is_empty() && (!follows || wal.held.len() + length > MAX_HELD || wal.committed) {
            let code = write_held(file);
            if code != ffi::SQLITE_OK {
                return code;
            }
        }
        let wal = &mut *file.cast::<WalFile>();
        if wal.committed || length > MAX_HELD {
            return match methods(file).xWrite {
                Some(write) => write(inner(file), data, amount, offset),
                None => ffi::SQLITE_IOERR_WRITE,
            };
        }
        if wal.held.is_empty() {
            wal.start = offset;
        }
        wal.held.extend_from_slice(bytes);
        // A frame header's second word is the database's size in pages for a
        // commit frame, 0 for any other.
        let commit_header = amount == FRAME_HEADER && bytes[4..8] != [0; 4];
        let ends = std::mem::replace(&mut wal.commit_page_next, commit_header) && !commit_header;
        if !ends {
            return ffi::SQLITE_OK;
        }
        wal.committed = true;
        write_held(file)
    }
}

/// Closes the base VFS's file inside `file`, and `file` with it; returns
/// `first` if it is an error, else the close's code.
///
/// # Safety
/// `file` is an open file of this VFS, closed once.
unsafe fn close(file: *mut ffi::sqlite3_file, first: c_int) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        let closed = match methods(file).xClose {
            Some(close) => close(inner(file)),
            None => ffi::SQLITE_OK,
        };
        (*file).pMethods = ptr::null();
        if first != ffi::SQLITE_OK { first } else { closed }
    }
}

unsafe extern "C" fn wal_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes an open file of this VFS once, and a WAL before its
    // database; the `WalFile` is dropped here, its inner file closed by the
    // base VFS.
    unsafe {
        let written = write_held(file);
        let database = (*file.cast::<WalFile>()).database;
        if !database.is_null() && ptr::eq((*database).wal, file) {
            (*database).wal = ptr::null_mut();
        }
        ptr::drop_in_place(file.cast::<WalFile>());
        close(file, written)
    }
}

unsafe extern "C" fn database_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes an open file of this VFS once.
    unsafe { close(file, write_held_wal(file)) }
}

/// The base VFS's `xFetch` (a page of a memory-mapped file), after `before`.
///
/// # Safety
/// `file` is an open file of this VFS, `page` a place for the page.
unsafe fn fetch(
    file: *mut ffi::sqlite3_file,
    before: unsafe fn(*mut ffi::sqlite3_file) -> c_int,
    offset: i64,
    amount: c_int,
    page: *mut *mut c_void,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        *page = ptr::null_mut();
        let code = before(file);
        if code != ffi::SQLITE_OK {
            return code;
        }
        match methods(file).xFetch {
            Some(fetch) => fetch(inner(file), offset, amount, page),
            None => ffi::SQLITE_OK,
        }
    }
}

unsafe extern "C" fn wal_fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    page: *mut *mut c_void,
) -> c_int {
    // SAFETY: SQLite passes an open file of this VFS and a place for the page.
    unsafe { fetch(file, write_held, offset, amount, page) }
}

unsafe extern "C" fn database_fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    page: *mut *mut c_void,
) -> c_int {
    // SAFETY: SQLite passes an open file of this VFS and a place for the page.
    unsafe { fetch(file, nothing, offset, amount, page) }
}

/// A method that does what the base VFS does, after `$before` (a function of
/// the file that returns a code: an error is returned instead).
macro_rules! forward {
    ($name:ident, $method:ident, $before:expr, $missing:expr, ($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            // SAFETY: SQLite passes an open file of this VFS.
            unsafe {
                let code = $before(file);
                if code != ffi::SQLITE_OK {
                    return code;
                }
                match methods(file).$method {
                    Some(method) => method(inner(file) $(, $arg)*),
                    None => $missing,
                }
            }
        }
    };
}

/// Nothing to do before a method.
unsafe fn nothing(_: *mut ffi::sqlite3_file) -> c_int {
    ffi::SQLITE_OK
}

forward!(wal_read, xRead, write_held, ffi::SQLITE_IOERR_READ, (data: *mut c_void, amount: c_int, offset: i64));
forward!(wal_truncate, xTruncate, write_held, ffi::SQLITE_IOERR_TRUNCATE, (size: i64));
forward!(wal_sync, xSync, write_held, ffi::SQLITE_IOERR_FSYNC, (flags: c_int));
forward!(wal_file_size, xFileSize, write_held, ffi::SQLITE_IOERR_FSTAT, (size: *mut i64));
forward!(wal_file_control, xFileControl, write_held, ffi::SQLITE_NOTFOUND, (op: c_int, arg: *mut c_void));
forward!(read, xRead, nothing, ffi::SQLITE_IOERR_READ, (data: *mut c_void, amount: c_int, offset: i64));
forward!(write, xWrite, nothing, ffi::SQLITE_IOERR_WRITE, (data: *const c_void, amount: c_int, offset: i64));
forward!(truncate, xTruncate, nothing, ffi::SQLITE_IOERR_TRUNCATE, (size: i64));
forward!(sync, xSync, nothing, ffi::SQLITE_IOERR_FSYNC, (flags: c_int));
forward!(file_size, xFileSize, nothing, ffi::SQLITE_IOERR_FSTAT, (size: *mut i64));
forward!(file_control, xFileControl, nothing, ffi::SQLITE_NOTFOUND, (op: c_int, arg: *mut c_void));
forward!(lock, xLock, nothing, ffi::SQLITE_OK, (level: c_int));
forward!(unlock, xUnlock, nothing, ffi::SQLITE_OK, (level: c_int));
forward!(check_reserved, xCheckReservedLock, nothing, ffi::SQLITE_OK, (out: *mut c_int));
forward!(sector_size, xSectorSize, nothing, 4096, ());
forward!(device, xDeviceCharacteristics, nothing, 0, ());
forward!(shm_map, xShmMap, nothing, ffi::SQLITE_IOERR_SHMMAP, (page: c_int, size: c_int, extend: c_int, out: *mut *mut c_void));
forward!(shm_unmap, xShmUnmap, nothing, ffi::SQLITE_OK, (delete: c_int));
forward!(unfetch, xUnfetch, nothing, ffi::SQLITE_OK, (offset: i64, page: *mut c_void));
forward!(shm_lock, xShmLock, nothing, ffi::SQLITE_IOERR_SHMLOCK, (offset: c_int, count: c_int, flags: c_int));
forward!(database_shm_lock, xShmLock, write_held_wal_first, ffi::SQLITE_IOERR_SHMLOCK, (offset: c_int, count: c_int, flags: c_int));

/// Before a lock of the WAL index changes (a transaction begins or ends): writes
/// what the WAL holds, and ends its transaction's `committed` stretch. What it
/// holds then can only be frames of a transaction that did not commit (a
/// commit's are written with its commit frame, and whatever follows them at
/// once), which no connection will read: if the write fails, they are dropped,
/// and the lock changes all the same (an unlock must).
unsafe fn write_held_wal_first(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite passes an open file of this VFS; its WAL is open while linked.
    unsafe {
        let code = write_held_wal(file);
        if code != ffi::SQLITE_OK {
            tracing::warn!(code, "frames of a transaction that did not commit could not be written to the WAL");
        }
        let wal = (*file.cast::<DatabaseFile>()).wal;
        if !wal.is_null() {
            (*wal.cast::<WalFile>()).committed = false;
        }
    }
    ffi::SQLITE_OK
}

/// Barriers that found frames held (none should: a commit is published after a
/// barrier, and its frames are written before; the tests check it stays 0).
#[cfg(test)]
static HELD_AT_BARRIER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite passes an open file of this VFS.
    unsafe {
        if let Some(barrier) = methods(file).xShmBarrier {
            barrier(inner(file));
        }
    }
}

/// The database's barrier, which SQLite passes before it publishes a commit in
/// the WAL index: should the WAL hold anything then, it is written first (a
/// barrier cannot fail: an error is logged).
unsafe extern "C" fn database_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite passes an open file of this VFS; its WAL is open while linked.
    unsafe {
        let wal = (*file.cast::<DatabaseFile>()).wal;
        if !wal.is_null() && !(*wal.cast::<WalFile>()).held.is_empty() {
            #[cfg(test)]
            HELD_AT_BARRIER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let code = write_held(wal);
            if code != ffi::SQLITE_OK {
                tracing::error!(code, "frames held for the WAL could not be written before a commit was published");
            }
        }
        shm_barrier(file);
    }
}

/// A WAL's methods: the base VFS's, around what it holds.
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(wal_close),
    xRead: Some(wal_read),
    xWrite: Some(wal_write),
    xTruncate: Some(wal_truncate),
    xSync: Some(wal_sync),
    xFileSize: Some(wal_file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved),
    xFileControl: Some(wal_file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(wal_fetch),
    xUnfetch: Some(unfetch),
};

/// A database's methods: the base VFS's, except that a lock of the WAL index
/// changes only once its WAL holds nothing.
static DATABASE_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(database_close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device),
    xShmMap: Some(shm_map),
    xShmLock: Some(database_shm_lock),
    xShmBarrier: Some(database_shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(database_fetch),
    xUnfetch: Some(unfetch),
};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rusqlite::{Connection, OpenFlags};

    use super::*;

    fn count(connection: &Connection) -> i64 {
        connection.query_row("SELECT COUNT(*) FROM rows", [], |row| row.get(0)).unwrap()
    }

    /// A database in a directory of its own, with a table of rows: its
    /// directory, its path, a connection of the base VFS and one of this VFS
    /// (a small page cache, so that a large transaction spills frames to the WAL
    /// before its commit; no automatic checkpoint, so the WAL keeps them).
    fn store() -> (std::path::PathBuf, std::path::PathBuf, Connection, Connection) {
        register(SqliteFile::Exclusive).unwrap();
        let dir = std::env::temp_dir().join(format!("troupe-wal-vfs-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("store.db");
        let setup = SqliteFile::Exclusive.open(&path, OpenFlags::default()).unwrap();
        setup.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE rows (body TEXT NOT NULL);").unwrap();
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let writer = Connection::open_with_flags_and_vfs(&path, flags, name(SqliteFile::Exclusive)).unwrap();
        writer
            .execute_batch("PRAGMA synchronous = NORMAL; PRAGMA cache_size = 16; PRAGMA wal_autocheckpoint = 0;")
            .unwrap();
        (dir, path, setup, writer)
    }

    /// What a connection of this VFS commits is in the WAL file when `COMMIT`
    /// returns: another connection (of the base VFS) sees it, and so does a
    /// database opened afresh from the files, which recovers the WAL from its
    /// frames alone. That holds for small commits, for a transaction larger
    /// than what is held at most (written in several runs), and after a
    /// transaction that spilled frames to the WAL and rolled back (frames that
    /// must never count, nor land over what another connection writes next).
    #[test]
    fn commits_reach_the_wal_whole_and_in_order() {
        let (dir, path, setup, writer) = store();
        let reader = SqliteFile::Exclusive.open(&path, OpenFlags::SQLITE_OPEN_READ_WRITE).unwrap();
        reader.execute_batch("PRAGMA query_only = ON").unwrap();

        let mut committed = 0;
        for round in 0..50 {
            writer
                .execute("INSERT INTO rows (body) VALUES (?1)", [format!("row {round} {}", "x".repeat(round * 97))])
                .unwrap();
            committed += 1;
            assert_eq!(count(&reader), committed, "commit {round} is seen by another connection");
        }

        // Far larger than what is held at most: 6 MiB in one transaction.
        writer.execute_batch("BEGIN").unwrap();
        for _ in 0..1536 {
            writer.execute("INSERT INTO rows (body) VALUES (?1)", ["y".repeat(4000)]).unwrap();
        }
        writer.execute_batch("COMMIT").unwrap();
        committed += 1536;
        assert_eq!(count(&reader), committed);

        // Spilled frames of a transaction rolled back, then a commit after them.
        // (Fewer than what is held at most, so that all of them are held when
        // the transaction ends.)
        writer.execute_batch("BEGIN").unwrap();
        for _ in 0..24 {
            writer.execute("INSERT INTO rows (body) VALUES (?1)", ["z".repeat(4000)]).unwrap();
        }
        writer.execute_batch("ROLLBACK").unwrap();
        assert_eq!(count(&reader), committed, "a rolled-back transaction is not seen");
        // Another connection writes where those frames were; nothing of them may
        // land over its frames afterwards.
        setup.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
        setup.execute("INSERT INTO rows (body) VALUES ('from another connection')", []).unwrap();
        committed += 1;
        writer.execute("UPDATE rows SET body = 'changed' WHERE rowid % 7 = 0", []).unwrap();
        writer.execute("INSERT INTO rows (body) VALUES ('last')", []).unwrap();
        committed += 1;
        assert_eq!(count(&reader), committed);

        // The WAL as the files hold it, read by a process that opens them afresh
        // (copied, so that no connection of this one shares its memory).
        let copy = dir.join("copy.db");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(dir.join("store.db-wal"), dir.join("copy.db-wal")).unwrap();
        let fresh = Connection::open(&copy).unwrap();
        assert_eq!(count(&fresh), committed, "the WAL's frames recover every commit");
        let changed: i64 =
            fresh.query_row("SELECT COUNT(*) FROM rows WHERE body = 'changed'", [], |row| row.get(0)).unwrap();
        assert_eq!(changed, committed / 7);
        let check: String = fresh.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
        assert_eq!(check, "ok");
        drop((writer, reader, setup, fresh));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A transaction that writes a spilled page again rewrites its frames'
    /// checksums after its commit frame, the commit frame's header last: that
    /// header is in the file before the commit is published, not held until the
    /// transaction's lock is released (nothing is held at any barrier).
    #[test]
    fn frames_rewritten_after_the_commit_frame_are_written_before_it_is_published() {
        let (dir, path, setup, writer) = store();
        for _ in 0..100 {
            writer.execute("INSERT INTO rows (body) VALUES (?1)", ["a".repeat(1000)]).unwrap();
        }
        let before = HELD_AT_BARRIER.load(std::sync::atomic::Ordering::Relaxed);
        writer.execute_batch("BEGIN").unwrap();
        for round in 0..5 {
            writer.execute("UPDATE rows SET body = ?1", [format!("{round}").repeat(1000)]).unwrap();
        }
        writer.execute_batch("COMMIT").unwrap();
        assert_eq!(HELD_AT_BARRIER.load(std::sync::atomic::Ordering::Relaxed), before, "nothing held at a barrier");

        let copy = dir.join("copy.db");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(dir.join("store.db-wal"), dir.join("copy.db-wal")).unwrap();
        let fresh = Connection::open(&copy).unwrap();
        let last: i64 =
            fresh.query_row("SELECT COUNT(*) FROM rows WHERE body LIKE '4%'", [], |row| row.get(0)).unwrap();
        assert_eq!(last, 100, "the WAL's frames recover the transaction");
        drop((writer, setup, fresh));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Under `synchronous = FULL` on a device without powersafe overwrites, a
    /// commit pads the WAL to a sector with copies of its commit frame, the last
    /// one split around a sync: they are written at once too, before the commit
    /// is published.
    #[test]
    fn padding_frames_are_written_before_the_commit_is_published() {
        let (dir, path, setup, writer) = store();
        drop(writer);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let uri = format!("file:{}?psow=0", path.display());
        let writer = Connection::open_with_flags_and_vfs(&uri, flags, name(SqliteFile::Exclusive)).unwrap();
        writer.execute_batch("PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 0;").unwrap();
        let before = HELD_AT_BARRIER.load(std::sync::atomic::Ordering::Relaxed);
        for round in 0..20 {
            writer.execute("INSERT INTO rows (body) VALUES (?1)", [format!("row {round}").repeat(50)]).unwrap();
        }
        assert_eq!(HELD_AT_BARRIER.load(std::sync::atomic::Ordering::Relaxed), before, "nothing held at a barrier");
        let copy = dir.join("copy.db");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(dir.join("store.db-wal"), dir.join("copy.db-wal")).unwrap();
        let fresh = Connection::open(&copy).unwrap();
        assert_eq!(count(&fresh), 20, "the WAL's frames recover every commit");
        let check: String = fresh.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
        assert_eq!(check, "ok");
        drop((writer, setup, fresh));
        let _ = std::fs::remove_dir_all(dir);
    }
}
