"""Writing outputs so that nothing is lost: every file through a temporary sibling and a rename, every output
path checked before the work that produces it (docs/ARCHITECTURE.md, "Bad input").

- `atomic_write(path)`: a file object on a temporary file in the same folder, renamed over `path` only when the
  block ends normally. A failure midway (an exception, Ctrl-C, a full disk, a file size limit) removes the
  temporary file and leaves whatever was at `path` before untouched; a reader never sees half a file.
- `atomic_files()`: several files committed together (a figure's PNG and the CSV it was drawn from): all are
  written first, then renamed one after the other, so a failure leaves the old pair, never a new PNG beside an
  old CSV.
- `check_outputs(outputs, inputs)` / `check_output_folder(path)`: an output path that cannot be written, that
  is a folder, or that names an input or another output is refused (`OutputPathError`, a ValueError: the
  command lines print it as one `error:` line) before any work starts.
- `remove_stale_temps(folder, name)`: temporaries left by a killed process (named `.NAME.tmp-PID@HOST-XXXX`)
  are removed by the next writer of NAME; a live writer's temporary is left alone.

Pure standard library (sim never imports torch); reference/ uses it too (the converted-model cache).
"""
from __future__ import annotations

import contextlib
import csv
import errno
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import IO, Iterable, Iterator, Mapping, Union

PathLike = Union[str, os.PathLike]
# Outputs or inputs: {flag: path}, [(flag, path), ...] or [path, ...]; a path of None is skipped (flag not given).
Paths = Union[Mapping[str, "PathLike | None"], Iterable]

STALE_AFTER_S = 600.0  # a temporary whose writer cannot be checked (another host, no pid in the name) is stale after
FORGOTTEN_AFTER_S = 86400.0  # any temporary this old is stale, whatever its pid says (pids are reused)
_NAME_PART = 100  # characters of the output's name kept in its temporary's name (names are limited to 255 bytes)
# Errors of the file system while writing: reported as "cannot write PATH" (the old file is still there).
_WRITE_ERRNOS = {errno.EFBIG, errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}


class OutputPathError(ValueError):
    """An output path refused before any work: the message names the flag, the path and what is wrong."""


class OutputWriteError(OSError):
    """Writing an output failed (a full disk, a size limit): the message names the output; nothing was replaced.
    `errno` and `strerror` are the file system's; `path` is the output."""

    def __init__(self, errno_: int | None, strerror: str, path: PathLike) -> None:
        super().__init__(errno_, strerror)
        self.path = os.fspath(path)

    def __str__(self) -> str:
        return f"cannot write {self.path}: {self.strerror} (nothing was replaced)"

    def __reduce__(self):  # pickles (a worker process's error) with its path
        return type(self), (self.errno, self.strerror, self.path)


# ---------------------------------------------------------------------------------------------- temporaries


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._]", "_", socket.gethostname()) or "host"


def _stem(name: str) -> str:
    return f".{name[:_NAME_PART]}.tmp-"


def temp_prefix(name: str) -> str:
    """The name prefix of a temporary sibling of `name` made by this process: `.NAME.tmp-PID@HOST-`."""
    return f"{_stem(name)}{os.getpid()}@{_host()}-"


_OWNER = re.compile(r"(\d{1,10})@(.*)-[^-]*\Z")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _is_stale(path: Path, rest: str, now: float) -> bool:
    try:
        age = now - path.lstat().st_mtime
    except FileNotFoundError:
        return False
    if age > FORGOTTEN_AFTER_S:
        return True
    owner = _OWNER.match(rest)
    if owner and int(owner.group(1)) > 0 and owner.group(2) == _host():
        return not _alive(int(owner.group(1)))
    return age > STALE_AFTER_S  # written elsewhere, or by a version that did not name its writer


def remove_stale_temps(folder: PathLike, name: str) -> list[Path]:
    """Remove the temporaries of `name` in `folder` whose writer is gone: the pid in the name is no live process
    of this host, or (writer unknown) untouched for STALE_AFTER_S. Returns what was removed; never raises."""
    folder, stem, now, removed = Path(folder), _stem(name), time.time(), []
    try:
        entries = [entry for entry in os.scandir(folder) if entry.name.startswith(stem)]
    except OSError:
        return removed
    for entry in entries:
        path = Path(entry.path)
        if not _is_stale(path, entry.name[len(stem):], now):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:  # another process cleaning at the same time, or not ours to remove
            continue
        removed.append(path)
    return removed


def _default_mode() -> int:
    """0o666 less the umask: what open() would have made. Read from /proc where it can be (setting the umask to
    read it back would briefly change it for every thread of the process)."""
    try:
        with open("/proc/self/status") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


# ------------------------------------------------------------------------------------------------- writing


class AtomicFiles:
    """Files written to temporaries and renamed into place together by `commit` (see `atomic_files`)."""

    def __init__(self, *, make_parents: bool = False, fsync: bool = True) -> None:
        self.make_parents, self.fsync = make_parents, fsync
        self._pending: list[tuple[str, Path]] = []

    @contextlib.contextmanager
    def open(self, path: PathLike, mode: str = "w", *, newline: str | None = None,
             encoding: str | None = None) -> Iterator[IO]:
        """A file object for `path` (mode "w" or "wb"), renamed into place at `commit`."""
        if mode not in ("w", "wt", "wb"):
            raise ValueError(f"atomic writes take mode 'w' or 'wb', got {mode!r}")
        if "b" not in mode and encoding is None:
            encoding = "utf-8"
        dest = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)  # a link keeps pointing here
        if dest.exists() and not dest.is_dir() and not dest.is_file():  # /dev/null, a FIFO: nothing to replace
            with open(dest, mode, newline=newline, encoding=encoding) as f:
                yield f
            return
        if dest.is_dir():
            raise IsADirectoryError(errno.EISDIR, f"cannot write {path}: it is a folder")
        if self.make_parents:
            dest.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(dest.parent, dest.name)
        try:
            perms = stat.S_IMODE(dest.stat().st_mode)  # replacing a file keeps its permissions
        except OSError:
            perms = _default_mode()  # mkstemp's files are private (0600): an output is an ordinary file
        try:
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=temp_prefix(dest.name))
        except OSError as err:
            raise self._error(err, path) from err
        try:
            try:
                os.fchmod(fd, perms)
                f = os.fdopen(fd, mode, newline=newline, encoding=encoding)
            except BaseException:
                os.close(fd)
                raise
            with f:
                yield f
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
        except BaseException as err:
            _unlink(tmp)
            if isinstance(err, OSError) and err.errno in _WRITE_ERRNOS and not isinstance(err, OutputWriteError):
                raise self._error(err, path) from err
            raise
        self._pending.append((tmp, dest))

    @staticmethod
    def _error(err: OSError, path: PathLike) -> OutputWriteError:
        return OutputWriteError(err.errno, err.strerror or str(err), path)

    def commit(self) -> None:
        """Rename every written temporary over its output, in the order written."""
        pending, self._pending = self._pending, []
        for i, (tmp, dest) in enumerate(pending):
            try:
                os.replace(tmp, dest)
            except BaseException as err:  # the rest stay as they were; their temporaries go
                for rest, _ in pending[i:]:
                    _unlink(rest)
                if isinstance(err, OSError):
                    raise self._error(err, dest) from err
                raise

    def discard(self) -> None:
        pending, self._pending = self._pending, []
        for tmp, _ in pending:
            _unlink(tmp)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def atomic_files(*, make_parents: bool = False, fsync: bool = True) -> Iterator[AtomicFiles]:
    """`with atomic_files() as files:` then `with files.open(path) as f:` for each file; all are renamed into
    place when the outer block ends normally, none if anything in it fails (Ctrl-C included)."""
    files = AtomicFiles(make_parents=make_parents, fsync=fsync)
    try:
        yield files
    except BaseException:
        files.discard()
        raise
    files.commit()


@contextlib.contextmanager
def atomic_write(path: PathLike, mode: str = "w", *, newline: str | None = None, encoding: str | None = None,
                 make_parents: bool = False, fsync: bool = True) -> Iterator[IO]:
    """`with atomic_write(path) as f:` writes `path` whole or not at all (see the module docstring).
    make_parents: create missing folders first (only for paths the program chose, e.g. a default output)."""
    with atomic_files(make_parents=make_parents, fsync=fsync) as files:
        with files.open(path, mode, newline=newline, encoding=encoding) as f:
            yield f


def write_text(path: PathLike, text: str, **kwargs) -> None:
    with atomic_write(path, "w", **kwargs) as f:
        f.write(text)


def write_bytes(path: PathLike, data: bytes, **kwargs) -> None:
    with atomic_write(path, "wb", **kwargs) as f:
        f.write(data)


def save_figure(fig, path: PathLike, *, format: str = "png", files: AtomicFiles | None = None, **savefig) -> None:
    """fig.savefig into `path` atomically (the format is given: the temporary's name has no .png to go by);
    with `files`, as part of that group."""
    if files is None:
        with atomic_write(path, "wb") as f:
            fig.savefig(f, format=format, **savefig)
    else:
        with files.open(path, "wb") as f:
            fig.savefig(f, format=format, **savefig)


def write_csv(path: PathLike, columns: Iterable[str], rows: Iterable[Mapping], *, comments: Iterable[str] = (),
              make_parents: bool = False, files: AtomicFiles | None = None) -> None:
    """Dict rows under a header of `columns`, after `# comment` lines if any, written atomically; with `files`, as
    part of that group (as save_figure)."""
    opened = atomic_write(path, "w", newline="", make_parents=make_parents) if files is None else files.open(
        path, "w", newline="")
    with opened as f:
        f.writelines(f"# {line}\n" for line in comments)
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)


# ------------------------------------------------------------------------------------------------ checking


def _pairs(paths: Paths | None) -> list[tuple[str | None, str]]:
    if paths is None:
        return []
    items = paths.items() if isinstance(paths, Mapping) else paths
    out = []
    for item in items:
        flag, path = item if isinstance(item, tuple) else (None, item)
        if path is not None:
            out.append((flag, os.fspath(path)))
    return out


def _label(flag: str | None, path: str) -> str:
    return f"{flag} {path}" if flag else path


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def _nearest_existing(folder: str) -> str:
    path = Path(folder)
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return str(path)


def _check_folder(label: str, folder: str, *, make: bool) -> None:
    """`folder` must be (or, with make, become) a writable folder."""
    if not os.path.exists(folder):
        if not make:
            raise OutputPathError(f"{label}: folder {folder} does not exist")
        ancestor = _nearest_existing(folder)
        if not os.path.isdir(ancestor):
            raise OutputPathError(f"{label}: cannot create folder {folder}: {ancestor} is not a folder")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise OutputPathError(f"{label}: cannot create folder {folder}: {ancestor} is not writable")
        return
    if not os.path.isdir(folder):
        raise OutputPathError(f"{label}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{label}: folder {folder} is not writable")


def check_outputs(outputs: Paths, inputs: Paths | None = (), *, make_parents: bool = False) -> None:
    """Refuse, before any work, an output file that could not be written: a folder, a read-only file, a missing
    or unwritable folder (with make_parents: one that cannot be created), the same file as an input (by any
    spelling: ./x, a/../x, a symlink, a hard link) or as another output. `outputs` and `inputs` are {flag: path},
    [(flag, path)] or [path]; None paths are skipped. Raises OutputPathError naming the flag."""
    outs, ins = _pairs(outputs), _pairs(inputs)
    for i, (flag, path) in enumerate(outs):
        label = _label(flag, path)
        if not path.strip():
            raise OutputPathError(f"{flag or 'output'}: empty path (expected a file path)")
        if os.fspath(path) == "-":  # many tools read it as standard output; here it would be a file named "-"
            raise OutputPathError(f"{flag or 'output'} -: not standard output here (expected a file path; ./- for a "
                                  "file named -)")
        if os.path.isdir(path):
            raise OutputPathError(f"{label}: is a folder (expected a file path)")
        for in_flag, in_path in ins:
            if _same_file(path, in_path):
                raise OutputPathError(f"{label}: is the input {_label(in_flag, in_path)} (refusing to overwrite "
                                      "an input; write the output elsewhere)")
        for other_flag, other_path in outs[:i]:
            if _same_file(path, other_path):
                raise OutputPathError(f"{label}: is also {_label(other_flag, other_path)} (each output needs a "
                                      "file of its own)")
        real = os.path.realpath(path) if os.path.islink(path) else path
        if os.path.exists(real):
            if not os.path.isfile(real):  # a device or a FIFO (/dev/null): written in place
                continue
            if not os.access(real, os.W_OK):
                raise OutputPathError(f"{label}: the file is read-only")
        _check_folder(label, os.path.dirname(real) or ".", make=make_parents)


def check_output_folder(path: PathLike, flag: str | None = None, *, files: Iterable[str] = ()) -> None:
    """Refuse, before any work, an output folder that is a file or cannot be created or written, or in which
    one of `files` (names the command will write there) is a folder or read-only. A missing folder is fine
    when it can be created (the writer creates it)."""
    folder = os.fspath(path)
    label = _label(flag, folder)
    if not folder.strip():
        raise OutputPathError(f"{flag or 'output'}: empty path (expected a folder)")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise OutputPathError(f"{label}: is a file, not a folder")
    _check_folder(label, folder, make=True)
    for name in files:
        file = os.path.join(folder, name)
        if os.path.isdir(file):
            raise OutputPathError(f"{label}: {file} is a folder (expected a file there)")
        if os.path.isfile(file) and not os.access(file, os.W_OK):
            raise OutputPathError(f"{label}: {file} is read-only")


__all__ = ["AtomicFiles", "OutputPathError", "OutputWriteError", "atomic_files", "atomic_write",
           "check_output_folder", "check_outputs", "remove_stale_temps", "save_figure", "temp_prefix",
           "write_bytes", "write_csv", "write_text"]
