"""Discovery of what ``chm-emu serve`` could run on: block devices, devdax, NUMA.

Block devices are listed with pyudev (size, model, logical block size,
rotational flag, read-only flag) and given a verdict: usable, or the reasons
they are not (mounted, partitions, holders, a filesystem or swap signature,
read-only). udev's database is used when it exists; where it does not (a
container without udevd) the same facts come from sysfs and ``blkid -p``,
and the report says so. NUMA nodes come from py-libnuma (sysfs when libnuma
is unusable); a node with memory and no CPUs is flagged as a CXL-memory
candidate. devdax devices are read from ``/sys/bus/dax/devices``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BlockDevice",
    "DaxDevice",
    "Discovery",
    "NumaNode",
    "FORCE_KEYS",
    "check_target",
    "discover",
    "list_block_devices",
    "list_dax_devices",
    "numa_nodes",
    "reason_key",
]

SYS_BLOCK = Path("/sys/class/block")
SYS_DAX = Path("/sys/bus/dax/devices")
SYS_NODE = Path("/sys/devices/system/node")
UDEV_DB = Path("/run/udev/data")


@dataclass
class BlockDevice:
    """One whole-disk block device and whether serve may take it."""

    name: str
    path: str
    size: int
    model: str
    logical_block_size: int
    rotational: bool
    read_only: bool
    partitions: list[str] = field(default_factory=list)
    holders: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    signature: str = ""  # filesystem / swap / partition-table type found on it
    reasons: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return not self.reasons

    @property
    def verdict(self) -> str:
        return "usable" if self.usable else "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["usable"] = self.usable
        return d


@dataclass
class DaxDevice:
    name: str
    path: str
    size: int
    align: int
    target_node: int


@dataclass
class NumaNode:
    node: int
    cpus: list[int]
    mem_bytes: int

    @property
    def cxl_candidate(self) -> bool:
        """Memory without CPUs: how CXL-attached memory appears to Linux."""
        return not self.cpus and self.mem_bytes > 0


@dataclass
class Discovery:
    blocks: list[BlockDevice]
    dax: list[DaxDevice]
    numa: list[NumaNode]
    notes: list[str]  # what was missing and what was used instead

    def to_dict(self) -> dict[str, Any]:
        return {
            "block_devices": [b.to_dict() for b in self.blocks],
            "dax_devices": [asdict(d) for d in self.dax],
            "numa_nodes": [{**asdict(n), "cxl_candidate": n.cxl_candidate} for n in self.numa],
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------- helpers


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def _int(path: Path, default: int = 0) -> int:
    try:
        return int(_read(path))
    except ValueError:
        return default


def _mountinfo() -> dict[str, list[str]]:
    """major:minor -> mount points (of this process's mount namespace)."""
    out: dict[str, list[str]] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        f = line.split()
        if len(f) > 4:
            out.setdefault(f[2], []).append(f[4].replace("\\040", " "))
    return out


def _swaps() -> set[str]:
    try:
        lines = Path("/proc/swaps").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {os.path.realpath(ln.split()[0]) for ln in lines if ln.split()}


def _blkid_signature(path: str) -> str | None:
    """The filesystem/swap/partition-table type ``blkid -p`` finds, "" for none,
    None when blkid cannot say (not installed, or no permission)."""
    exe = shutil.which("blkid") or ("/usr/sbin/blkid" if os.path.exists("/usr/sbin/blkid") else "")
    if not exe:
        return None
    try:
        r = subprocess.run(
            [exe, "-p", "-o", "export", path], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode == 2 and not r.stderr.strip():  # probed, nothing found
        return ""
    if r.returncode != 0:
        return None
    props = dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln)
    if "PTTYPE" in props and "TYPE" not in props:
        return f"partition table {props['PTTYPE']}"
    kind = props.get("TYPE", "")
    return f"swap signature ({kind})" if kind == "swap" else (f"filesystem {kind}" if kind else "")


def _udev_signature(props: dict[str, str]) -> str | None:
    if not props:
        return None
    if props.get("ID_FS_TYPE"):
        t = props["ID_FS_TYPE"]
        return f"swap signature ({t})" if t == "swap" else f"filesystem {t}"
    if props.get("ID_PART_TABLE_TYPE"):
        return f"partition table {props['ID_PART_TABLE_TYPE']}"
    return None


def _judge(b: BlockDevice) -> None:
    r = b.reasons
    if b.mounts:
        r.append(f"mounted at {', '.join(b.mounts)}")
    if b.partitions:
        r.append(f"has partitions ({', '.join(b.partitions)})")
    if b.holders:
        r.append(f"has holders ({', '.join(b.holders)})")
    if b.signature:
        r.append(f"holds a {b.signature}")
    if b.read_only:
        r.append("read-only")
    if b.size == 0:
        r.append("size 0 (no medium)")


def _describe(
    sys_path: Path, udev_props: dict[str, str], mounts: dict[str, list[str]], swaps: set[str]
) -> BlockDevice:
    name = sys_path.name
    dev_path = f"/dev/{name}"
    parts = sorted(p.name for p in sys_path.iterdir() if p.is_dir() and (p / "partition").exists())
    holders = sorted(os.listdir(sys_path / "holders")) if (sys_path / "holders").is_dir() else []
    mm = [_read(sys_path / "dev")] + [_read(sys_path / p / "dev") for p in parts]
    mnt: list[str] = []
    for m in mm:
        mnt += mounts.get(m, [])
    for node in [dev_path] + [f"/dev/{p}" for p in parts]:
        if os.path.realpath(node) in swaps:
            mnt.append(f"[swap {node}]")
    model = udev_props.get("ID_MODEL", "") or _read(sys_path / "device" / "model")
    if not model and name.startswith("loop"):
        backing = _read(sys_path / "loop" / "backing_file")
        model = f"loop: {backing}" if backing else "loop"
    sig = _udev_signature(udev_props)
    if sig is None:
        sig = _blkid_signature(dev_path) if os.path.exists(dev_path) else None
    b = BlockDevice(
        name=name,
        path=dev_path,
        size=_int(sys_path / "size") * 512,
        model=model or "-",
        logical_block_size=_int(sys_path / "queue" / "logical_block_size", 512),
        rotational=_read(sys_path / "queue" / "rotational") == "1",
        read_only=_read(sys_path / "ro") == "1",
        partitions=parts,
        holders=holders,
        mounts=mnt,
        signature=sig or "",
    )
    if sig is None:
        b.reasons.append("signature unknown (no udev data and blkid could not probe it)")
    _judge(b)
    return b


def _skip(name: str, sys_path: Path) -> bool:
    if (sys_path / "partition").exists():
        return True
    # detached loop devices and empty ram/zram slots are not candidates
    return name.startswith(("loop", "ram")) and _int(sys_path / "size") == 0


def list_block_devices(notes: list[str] | None = None) -> list[BlockDevice]:
    """Every whole-disk block device with its verdict (pyudev, else sysfs)."""
    notes = notes if notes is not None else []
    mounts, swaps = _mountinfo(), _swaps()
    have_db = UDEV_DB.is_dir()
    out: list[BlockDevice] = []
    try:
        import pyudev
    except ImportError:
        notes.append("pyudev is not installed: block devices read from sysfs")
        pyudev = None
    if pyudev is not None:
        if not have_db:
            notes.append(
                f"no udev database ({UDEV_DB}): models and signatures from sysfs and blkid -p"
            )
        ctx = pyudev.Context()
        for d in ctx.list_devices(subsystem="block", DEVTYPE="disk"):
            sp = Path(d.sys_path)
            if _skip(d.sys_name, sp):
                continue
            props = {k: str(d.properties[k]) for k in d.properties} if have_db else {}
            out.append(_describe(sp, props, mounts, swaps))
        return sorted(out, key=lambda b: b.name)
    if SYS_BLOCK.is_dir():
        for sp in sorted(SYS_BLOCK.iterdir()):
            real = sp.resolve()
            if not _skip(sp.name, real):
                out.append(_describe(real, {}, mounts, swaps))
    return out


def list_dax_devices() -> list[DaxDevice]:
    out: list[DaxDevice] = []
    if not SYS_DAX.is_dir():
        return out
    for d in sorted(SYS_DAX.iterdir()):
        out.append(
            DaxDevice(
                name=d.name,
                path=f"/dev/{d.name}",
                size=_int(d / "size"),
                align=_int(d / "align"),
                target_node=_int(d / "target_node", -1),
            )
        )
    return out


def _sysfs_numa() -> list[NumaNode]:
    out: list[NumaNode] = []
    if not SYS_NODE.is_dir():
        return out
    for d in sorted(SYS_NODE.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = sorted(int(c.name[3:]) for c in d.glob("cpu[0-9]*"))
        mem = 0
        for line in _read(d / "meminfo").splitlines():
            if "MemTotal:" in line:
                mem = int(line.split()[-2]) * 1024
        out.append(NumaNode(int(d.name[4:]), cpus, mem))
    return out


def numa_nodes(notes: list[str] | None = None) -> list[NumaNode]:
    """NUMA nodes with their CPUs and memory (py-libnuma, else sysfs)."""
    notes = notes if notes is not None else []
    sysfs = {n.node: n for n in _sysfs_numa()}
    try:
        from numa import info as numa_info
    except (ImportError, OSError) as exc:
        notes.append(f"py-libnuma unusable ({exc}): NUMA nodes read from sysfs")
        return list(sysfs.values())
    if not numa_info.numa_available():
        notes.append("libnuma reports NUMA unavailable: NUMA nodes read from sysfs")
        return list(sysfs.values())
    out = []
    for node in range(numa_info.get_max_node() + 1):
        cpus = list(numa_info.node_to_cpus(node))
        mem = sysfs[node].mem_bytes if node in sysfs else 0
        out.append(NumaNode(node, cpus, mem))
    return out


def discover() -> Discovery:
    notes: list[str] = []
    blocks = list_block_devices(notes)
    dax = list_dax_devices()
    numa = numa_nodes(notes)
    return Discovery(blocks, dax, numa, notes)


def check_target(path: str) -> list[str]:
    """Why serve must not take ``path`` (empty: safe). Regular files are always
    safe; a block device (or a partition of one) is judged like ``devices`` does."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return []  # a file that serve will create
    if not stat.S_ISBLK(st.st_mode):
        return []
    mm = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    sp = Path(f"/sys/dev/block/{mm}").resolve()
    if not sp.exists():
        return [f"no sysfs entry for block device {mm}"]
    props: dict[str, str] = {}
    if UDEV_DB.is_dir():
        try:
            import pyudev

            d = pyudev.Devices.from_sys_path(pyudev.Context(), str(sp))
            props = {k: str(d.properties[k]) for k in d.properties}
        except Exception:  # a device udev does not know: sysfs and blkid only
            props = {}
    b = _describe(sp, props, _mountinfo(), _swaps())
    b.path = path
    return b.reasons


_REASON_KEYS = (
    ("mounted", "mounted"),
    ("has partitions", "partitions"),
    ("has holders", "holders"),
    ("holds a filesystem", "filesystem"),
    ("holds a swap", "swap"),
    ("holds a partition table", "partition-table"),
    ("read-only", "read-only"),
    ("signature unknown", "signature-unknown"),
    ("size 0", "empty"),
)
FORCE_KEYS = tuple(k for _, k in _REASON_KEYS)


def reason_key(reason: str) -> str:
    """The ``--force`` word that accepts a refusal reason."""
    for prefix, key in _REASON_KEYS:
        if reason.startswith(prefix):
            return key
    return "other"
