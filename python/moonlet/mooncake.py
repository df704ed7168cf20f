"""moonlet.mooncake - Mooncake Store's Python class, backed by moonlet.

For code written against ``mooncake.store``::

    from moonlet.mooncake import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    store.setup("localhost", "P2PHANDSHAKE", 512 << 20, 128 << 20, "tcp", "",
                "127.0.0.1:50051")
    store.put("k", b"v")
    store.get("k")

or, through the RealClient of this host (moonlet-store --serve-dummy PATH),
``store.setup_dummy(0, 64 << 20, "/run/moonlet/real.sock")``.

It keeps Mooncake's conventions rather than moonlet's: calls return 0 or a
negative error code (the same numbers) instead of raising, get() of a missing
key returns b"" (get_batch() a b"" per such key), is_exist() returns 1 / 0 /
a negative code, and a put of a key that already exists returns 0 and leaves
the object as it was (as Mooncake's Put and BatchPut do; upsert() replaces).
batch_probe_key() is moonlet's addition.

The same class is importable as ``mooncake.store.MooncakeDistributedStore``
(python/mooncake, installed unless a real Mooncake is there).  It has the
calls vLLM's, SGLang's and LMCache's Mooncake backends make (multi-buffer
batches, get_buffer, ranged reads and get sessions, replica descriptors,
MooncakeHostMemAllocator); docs/python.md has the table of Mooncake's whole
surface: supported, supported with a difference, not supported and why.
Device (GPU) memory: register_buffer and every call that takes addresses
accept CUDA device pointers (recognised by the driver, loaded at run time);
see docs/python.md, "GPU memory".
"""
import ctypes
import enum
import functools
import json
import logging
import mmap
import os
import random
import re
import socket
import threading
import weakref

from . import GrantLeasePolicy, ProbeLeaseMode, Store, StoreError, _moonlet

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "parse_size",
           "BufferHandle", "MooncakeHostMemAllocator", "ReplicaStatus", "ReplicaDescriptor",
           "MemoryDescriptor", "Descriptor", "load_config"]

_log = logging.getLogger("moonlet.mooncake")

_INVALID_PARAMS = _moonlet.INVALID_PARAMS
_UNAVAILABLE = _moonlet.UNAVAILABLE_IN_CURRENT_STATUS
_ALREADY_EXISTS = _moonlet.OBJECT_ALREADY_EXISTS
_NOT_FOUND = _moonlet.OBJECT_NOT_FOUND
_BUFFER_OVERFLOW = _moonlet.BUFFER_OVERFLOW

DEFAULT_GLOBAL_SEGMENT_SIZE = 16 << 20
DEFAULT_LOCAL_BUFFER_SIZE = 16 << 20
DEFAULT_MASTER_SERVER_ADDR = "127.0.0.1:50051"


class SoftPinAction(enum.IntEnum):
    """What a put does to the object's soft pin (Mooncake's SoftPinAction)."""

    PRESERVE = 0
    """Leave it as with_soft_pin says (a new object: pinned only with with_soft_pin)."""
    ENABLE = 1
    """Soft-pin the object (kept out of eviction for the soft-pin TTL)."""
    DISABLE = 2
    """Do not soft-pin the object."""


class ReplicateConfig:
    """Replication options of a put (Mooncake's ReplicateConfig).

    replica_num:        replicas on distinct store nodes (default 1).
    with_soft_pin:      soft-pin the object (default False).
    soft_pin_action:    a SoftPinAction; ENABLE / DISABLE override with_soft_pin.
    preferred_segment:  a segment tried first for the replicas ("" none).
    preferred_segments: more segments tried next, in order.  A name is a
                        moonlet segment name (a store node's client id, as
                        moonlet-inspect lists it) or a segment's endpoint
                        "host:port" (what get_hostname() returns and Mooncake
                        calls the segment name).  One that is unknown or full
                        is skipped; replicas still unplaced go round-robin.
    prefer_alloc_in_same_node: accepted, not used.
    with_hard_pin:      never evicted (Remove still removes it).  The master
                        refuses (NO_AVAILABLE_HANDLE) a hard pin that would
                        take hard-pinned bytes above half its capacity.
    soft_pin_ttl_ms:    this object's soft-pin TTL instead of the master's
                        --default_kv_soft_pin_ttl; None (the default): unset.
                        As in Mooncake, set only with soft_pin_action ENABLE:
                        otherwise a put with this config is INVALID_PARAMS.
    group_ids:          accepted, not used (moonlet has no object groups).
    """

    __slots__ = ("replica_num", "with_soft_pin", "soft_pin_action", "preferred_segment",
                 "preferred_segments", "prefer_alloc_in_same_node", "with_hard_pin",
                 "group_ids", "soft_pin_ttl_ms")

    def __init__(self, replica_num=1, with_soft_pin=False,
                 soft_pin_action=SoftPinAction.PRESERVE, preferred_segment="", *,
                 preferred_segments=None, prefer_alloc_in_same_node=False,
                 with_hard_pin=False, group_ids=None, soft_pin_ttl_ms=None):
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.soft_pin_action = soft_pin_action
        self.preferred_segment = preferred_segment
        self.preferred_segments = list(preferred_segments or [])
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node
        self.with_hard_pin = with_hard_pin
        self.group_ids = list(group_ids or [])
        self.soft_pin_ttl_ms = soft_pin_ttl_ms

    def _soft_pin(self):
        action = SoftPinAction(self.soft_pin_action)
        if action == SoftPinAction.ENABLE:
            return True
        if action == SoftPinAction.DISABLE:
            return False
        return bool(self.with_soft_pin)

    def __repr__(self):
        return (f"ReplicateConfig(replica_num={self.replica_num}, "
                f"with_soft_pin={self.with_soft_pin}, "
                f"soft_pin_action={SoftPinAction(self.soft_pin_action).name}, "
                f"preferred_segment={self.preferred_segment!r}, "
                f"preferred_segments={self.preferred_segments!r}, "
                f"with_hard_pin={self.with_hard_pin}, "
                f"soft_pin_ttl_ms={self.soft_pin_ttl_ms})")

    __str__ = __repr__


_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
          "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(value):
    """Bytes from an int or a human-readable size, as Mooncake reads config sizes.

    "16MB", "16 mb", "1.5GB", "512", "16MiB" -> bytes; units are binary
    (KB = 1024).  Raises ValueError for anything else, TypeError for a
    non-int, non-str value.
    """
    if isinstance(value, bool):
        raise TypeError("a size must be int or str, not bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"negative size {value}")
        return value
    if not isinstance(value, str):
        raise TypeError(f"a size must be int or str, not {type(value).__name__}")
    m = _SIZE_RE.match(value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _key_list(keys):
    """keys as a list; a single str (or bytes) is refused, as Mooncake's
    binding refuses it, rather than taken as a list of one-letter keys."""
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a sequence of str, not a single str")
    return list(keys)


def _split_host(hostname):
    """("host", "port" or None) of "host", "host:port" or "[v6]:port"."""
    if hostname.startswith("["):
        host, _, rest = hostname[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    if hostname.count(":") == 1:
        host, port = hostname.split(":")
        return host, port
    return hostname, None


def _join_host(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# Where Mooncake picks the port of a client whose local_hostname names none.
HOSTNAME_PORT_RANGE = (12300, 14300)


def _pick_port():
    """A port in HOSTNAME_PORT_RANGE that TCP can bind now (on every
    address), from a random start; None when none of them is free."""
    lo, hi = HOSTNAME_PORT_RANGE
    n = hi - lo + 1
    start = random.randrange(n)
    for i in range(n):
        port = lo + (start + i) % n
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    return None


_TRUE = ("1", "true", "yes", "on")


def _flag(value):
    """A config flag: bool, int, or a string such as "true" / "false"."""
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)


def load_config(path=None):
    """The dict of a Mooncake-style JSON config file: path, or the file
    MOONCAKE_CONFIG_PATH names.  Field names are those the engines write
    (local_hostname, metadata_server, global_segment_size, local_buffer_size,
    protocol, device_name, master_server_address; also rdma_devices,
    master_server_addr).  Raises OSError / ValueError for a missing or
    malformed file, KeyError when neither path nor the variable is given."""
    if path is None:
        path = os.environ["MOONCAKE_CONFIG_PATH"]
    with open(path) as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a config file holds one JSON object")
    return config


# ---- host memory ranges ------------------------------------------------------------------

def _host_ranges():
    """[(start, end)] of this process's readable and writable mappings."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 2)
            if len(fields) >= 2 and fields[1][:2] == "rw":
                lo, hi = fields[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def _is_host_memory(ptr, size):
    """True when [ptr, ptr + size) is readable and writable host memory of
    this process.  A GPU device pointer (cudaMalloc memory lives in address
    ranges the driver reserves without host access) or an unmapped address
    is not."""
    end = ptr + size
    for lo, hi in sorted(_host_ranges()):
        if lo <= ptr < hi:
            if end <= hi:
                return True
            ptr = hi  # continues into the next mapping, if adjacent
    return False


def _gpu_staging(local_buffer_size):
    """The client's pinned staging for device memory from Mooncake's
    local_buffer_size (its registered transfer buffer): that size when it
    is at least 2 MiB (moonlet's least), else moonlet's default (0)."""
    return local_buffer_size if local_buffer_size >= (2 << 20) else 0


def _device_of(ptr, size):
    """The CUDA device holding [ptr, ptr + size), or -1 (not device memory,
    or a range that runs past its device allocation)."""
    try:
        return _moonlet.device_memory(ptr, size)
    except (StoreError, OverflowError):
        return -1


class BufferHandle:
    """An object's bytes (Mooncake's BufferHandle): the buffer protocol
    (memoryview(h), bytes(h), numpy / torch frombuffer), ptr() (the
    address) and size() (the length).  The memory is the store's shared
    (DummyClient) or registered (direct) memory the object was read into, so
    the read made no copy on this side; it is freed when the handle goes."""

    __slots__ = ()

    def ptr(self):
        return ctypes.addressof(self)

    def size(self):
        return len(self)

    def __repr__(self):
        return f"<BufferHandle size={len(self)} ptr={ctypes.addressof(self):#x}>"


@functools.lru_cache(maxsize=128)
def _handle_type(n):
    return type("BufferHandle", (BufferHandle, ctypes.c_ubyte * n), {})


class _Memory:
    """The SharedBuffers behind live BufferHandles of one Store, so that
    close() can wait for the last handle before the Store (and the memory)
    goes: close() with handles alive ends the calls at once and closes the
    connection when the last handle is dropped."""

    def __init__(self, store):
        self.store = store
        self.live = 0
        self.closing = False
        self.lock = threading.Lock()

    def adopt(self, shared, n):
        handle = _handle_type(n).from_address(shared.address)
        handle._mem = shared
        with self.lock:
            self.live += 1
        weakref.finalize(handle, self._release, shared)
        return handle

    def _release(self, shared):
        shared.free()
        with self.lock:
            self.live -= 1
            last = self.closing and self.live == 0
        if last:
            self.store.close()

    def close(self):
        with self.lock:
            self.closing = True
            now = self.live == 0
        if now:
            self.store.close()


class ReplicaStatus(enum.IntEnum):
    """A replica's status (Mooncake's ReplicaStatus)."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class Descriptor:
    """Where a memory replica's bytes are: size, buffer_address (offset in
    the segment on moonlet), transport_endpoint ("host:port")."""

    __slots__ = ("size", "buffer_address", "transport_endpoint")

    def __init__(self, size=0, buffer_address=0, transport_endpoint=""):
        self.size, self.buffer_address, self.transport_endpoint = (
            size, buffer_address, transport_endpoint)

    def __repr__(self):
        return (f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
                f"transport_endpoint={self.transport_endpoint}>")


class MemoryDescriptor:
    __slots__ = ("buffer_descriptor",)

    def __init__(self, buffer_descriptor):
        self.buffer_descriptor = buffer_descriptor


class DiskDescriptor:
    """Where a disk replica lies (Mooncake's DiskDescriptor): moonlet's are
    on a store node's disk tier, read through that node, so there is no
    local file_path (""); object_size and the node's transport_endpoint."""

    __slots__ = ("file_path", "object_size", "transport_endpoint")

    def __init__(self, object_size, transport_endpoint):
        self.file_path = ""
        self.object_size = object_size
        self.transport_endpoint = transport_endpoint


class ReplicaDescriptor:
    """One replica (Mooncake's ReplicaDescriptor): in a node's memory, or
    on a node's disk tier (is_disk_replica)."""

    __slots__ = ("status", "_memory", "segment_name", "_disk")

    def __init__(self, status, memory, segment_name="", disk=False):
        self.status = status
        self._memory = memory
        self.segment_name = segment_name
        self._disk = disk

    def is_memory_replica(self):
        return not self._disk

    def is_disk_replica(self):
        return self._disk

    def get_memory_descriptor(self):
        if self._disk:
            raise RuntimeError("a disk replica has no memory descriptor")
        return self._memory

    def get_disk_descriptor(self):
        if not self._disk:
            raise RuntimeError("a memory replica has no disk descriptor")
        d = self._memory.buffer_descriptor
        return DiskDescriptor(d.size, d.transport_endpoint)

    def __repr__(self):
        return (f"<ReplicaDescriptor {self.status.name} "
                f"{self._memory.buffer_descriptor!r}>")


class MooncakeHostMemAllocator:
    """Host memory for an engine's KV pool (Mooncake's
    MooncakeHostMemAllocator): alloc(size) -> address (0 on failure),
    free(address) -> 0 / INVALID_PARAMS.  Anonymous pages of this process
    (mmap), page-aligned and zeroed; register them with register_buffer()
    before the zero-copy calls.  Unlike Mooncake's they are not shared with
    a RealClient: through a DummyClient those calls copy them once through
    the connection's staging."""

    def __init__(self):
        self._maps = {}
        self._lock = threading.Lock()

    def alloc(self, size):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            return 0
        try:
            m = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError, OverflowError):
            return 0
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        with self._lock:
            self._maps[addr] = m
        return addr

    def free(self, ptr):
        with self._lock:
            m = self._maps.pop(ptr, None)
        if m is None:
            return _INVALID_PARAMS
        try:
            m.close()
        except BufferError:  # a view of it is alive (cannot be from us): keep it mapped
            with self._lock:
                self._maps[ptr] = m
            return _INVALID_PARAMS
        return 0


class MooncakeDistributedStore:
    """Mooncake Store's MooncakeDistributedStore on a moonlet cluster.

    Create it, call setup() (a client of its own) or setup_dummy() (through
    a RealClient), use it, close() it.  Every call returns what Mooncake's
    returns (0 / a negative error code, sizes, bytes); none raises for a
    store error.  Calls before setup return UNAVAILABLE_IN_CURRENT_STATUS
    (-1010) (get(): b"", get_batch(): b"" per key).
    """

    def __init__(self):
        self._store = None
        self._hostname = ""
        self._memory = None        # _Memory of the BufferHandles of this setup
        self._local_buffer = None  # setup()'s local_buffer_size (None after setup_dummy)
        self._regions = {}         # registered buffers: address -> size
        self._sessions = {}        # batch_get_session_start: key -> [bytes, starts]
        self._lock = threading.Lock()

    # Keyword arguments engines pass to setup() besides Mooncake's seven.
    _SETUP_OPTIONS = ("enable_ssd_offload", "ssd_offload_path", "ssd_offload_size",
                      "enable_client_http_server", "client_http_port")

    # ---- setup -----------------------------------------------------------------

    def setup(self, local_hostname=None, metadata_server=None,
              global_segment_size=DEFAULT_GLOBAL_SEGMENT_SIZE,
              local_buffer_size=DEFAULT_LOCAL_BUFFER_SIZE, protocol="tcp", device_name="",
              master_server_address=DEFAULT_MASTER_SERVER_ADDR, engine=None, *,
              tenant_id="default", rdma_devices=None, master_server_addr=None, **options):
        """Connects to the master and, with global_segment_size > 0, contributes
        that much memory from this process.  Returns 0, or a negative code.

        Either the 7 positional arguments of Mooncake (local_hostname,
        metadata_server, global_segment_size, local_buffer_size, protocol,
        device_name, master_server_address; all also as keywords), one dict
        with those keys (also Mooncake's spellings rdma_devices /
        master_server_addr, and tenant_id), or nothing: then the JSON file
        MOONCAKE_CONFIG_PATH names is that dict.  Sizes may be ints or
        strings such as "16MB".  device_name may be a comma-separated list
        ("mlx5_0,mlx5_1"): RDMA uses the first; TCP none.
        metadata_server is accepted and not used.  local_buffer_size 0 makes
        every copying put fail with INVALID_PARAMS, as Mooncake's has no
        buffer to stage through; from 2 MiB up it bounds the pinned host
        memory through which device (GPU) buffers are staged (below 2 MiB:
        moonlet's default, 128 MiB).

        The keywords engines add are accepted: enable_client_http_server=True
        serves this client's GET /metrics (Prometheus text) and GET /health
        on client_http_port (every IPv4 address; without a port, a free one:
        self._store.http_port); enable_ssd_offload=True with ssd_offload_path
        (a directory: the file moonlet-disk.tier in it, or a file) puts a
        disk tier behind this client's segment (ssd_offload_size bytes,
        moonlet's addition; default 4 x global_segment_size): objects
        evicted from DRAM are demoted there and read back in one hop.  It
        needs global_segment_size > 0 and a path (else INVALID_PARAMS, with
        the reason logged).  A config's enable_offload (vLLM's) does the same
        when the config names ssd_offload_path, else it is logged as
        ignored.  Unknown keywords are logged and ignored; engine (a
        TransferEngine) must be None.
        """
        if local_hostname is None:
            try:
                return self._setup_dict(load_config())
            except (KeyError, OSError, ValueError) as e:
                _log.error("setup(): no arguments and no usable MOONCAKE_CONFIG_PATH: %s", e)
                return _INVALID_PARAMS
        if isinstance(local_hostname, dict):
            return self._setup_dict(dict(local_hostname, **options))
        if rdma_devices is not None:
            device_name = rdma_devices
        if master_server_addr is not None:
            master_server_address = master_server_addr
        self._warn_unknown(options)
        try:
            http_port = self._http_port(options)
            disk = self._disk(options, global_segment_size)
        except (TypeError, ValueError) as e:
            _log.error("setup(): %s", e)
            return _INVALID_PARAMS
        return self._setup(local_hostname, global_segment_size, local_buffer_size, protocol,
                           device_name, master_server_address, tenant_id, engine, http_port,
                           disk)

    def _warn_unknown(self, options):
        for name in options:
            if name not in self._SETUP_OPTIONS:
                _log.warning("setup(): ignoring unknown option %s", name)

    @staticmethod
    def _disk(options, global_segment_size):
        """(path, size) of the disk tier the options ask for, or None.  An
        offload that cannot be honoured raises ValueError (the reason)."""
        if not _flag(options.get("enable_ssd_offload", False)):
            return None
        path = options.get("ssd_offload_path")
        if not path:
            raise ValueError("enable_ssd_offload needs ssd_offload_path (a directory or a file "
                             "on a disk, not tmpfs)")
        if not parse_size(global_segment_size):
            raise ValueError("enable_ssd_offload needs global_segment_size > 0: the disk tier "
                             "sits behind this client's own segment (a client without one "
                             "reaches the disk tiers of the store nodes: moonlet-store --disk)")
        return str(path), parse_size(options.get("ssd_offload_size") or 0)

    @staticmethod
    def _http_port(options):
        """The client HTTP endpoint's port the options ask for (0: a free
        one), or None for none.  A bad port raises ValueError."""
        if not _flag(options.get("enable_client_http_server", False)):
            return None
        port = options.get("client_http_port")
        port = int(port) if port not in (None, "") else 0
        if not 0 <= port <= 65535:
            raise ValueError(f"client_http_port {port} is not a port")
        return port

    def _setup_dict(self, config):
        def get(*names, default=None):
            for n in names:
                if n in config and config[n] is not None:
                    return config[n]
            return default

        options = {k: v for k, v in config.items() if k in self._SETUP_OPTIONS}
        if _flag(config.get("enable_offload", False)):
            if options.get("ssd_offload_path"):
                options["enable_ssd_offload"] = True  # vLLM's switch for the same tier
            else:
                _log.warning("setup(): enable_offload is ignored: it needs ssd_offload_path")
        try:
            http_port = self._http_port(options)
            disk = self._disk(options, get("global_segment_size",
                                           default=DEFAULT_GLOBAL_SEGMENT_SIZE))
        except (TypeError, ValueError) as e:
            _log.error("setup(): %s", e)
            return _INVALID_PARAMS
        return self._setup(str(get("local_hostname", default="")),
                           get("global_segment_size", default=DEFAULT_GLOBAL_SEGMENT_SIZE),
                           get("local_buffer_size", default=DEFAULT_LOCAL_BUFFER_SIZE),
                           str(get("protocol", default="tcp")),
                           str(get("rdma_devices", "device_name", default="")),
                           str(get("master_server_addr", "master_server_address",
                                   default=DEFAULT_MASTER_SERVER_ADDR)),
                           str(get("tenant_id", default="default")), None, http_port, disk)

    def _setup(self, local_hostname, global_segment_size, local_buffer_size, protocol,
               device_name, master_addr, tenant_id, engine, http_port=None, disk=None):
        if self._store is not None or engine is not None or not local_hostname:
            return _INVALID_PARAMS
        try:
            segment = parse_size(global_segment_size)
            local_buffer = parse_size(local_buffer_size)
        except (TypeError, ValueError):
            return _INVALID_PARAMS
        if protocol not in ("tcp", "rdma"):
            return _INVALID_PARAMS
        devices = [d.strip() for d in str(device_name or "").split(",") if d.strip()]
        device_name = devices[0] if protocol == "rdma" and devices else ""
        host, port = _split_host(local_hostname)
        if not port or port == "0":
            # none configured: one in Mooncake's range, as Mooncake picks it
            port = _pick_port()
            if port is None:
                _log.error("setup(): no free port in %d-%d for %s", *HOSTNAME_PORT_RANGE, host)
                return _INVALID_PARAMS
        listen = _join_host(host, port) if segment else None
        try:
            self._store = Store.connect(master_addr, protocol=protocol, segment_size=segment,
                                        device=device_name or None, default_tenant=tenant_id,
                                        local_listen_addr=listen, http_port=http_port,
                                        gpu_staging_size=_gpu_staging(local_buffer),
                                        disk_path=disk[0] if disk else None,
                                        disk_size=disk[1] if disk else 0)
        except StoreError as e:
            return e.code
        except (TypeError, ValueError):
            return _INVALID_PARAMS
        endpoint = self._store.local_endpoint
        if endpoint:
            self._hostname = _join_host(host, endpoint.rsplit(':', 1)[1])
        else:
            # a pure client serves nothing: the port local_hostname gave, else
            # the one picked in Mooncake's range
            self._hostname = _join_host(host, port)
        self._local_buffer = local_buffer
        self._memory = _Memory(self._store)
        return 0

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address, *, tenant_id=None):
        """Connects through the RealClient serving on server_address (a
        DummyClient): every later call is made by that process's client.
        Returns 0, or a negative code.

        server_address: in Mooncake the RealClient's "host:port"; a moonlet
            RealClient (moonlet-store --serve-dummy PATH) listens on a unix
            socket, so this is that socket's path.  An empty or non-str
            address is INVALID_PARAMS (-600); a path where no RealClient
            listens is RPC_FAIL (-900), the connect's own code.
        local_buffer_size: the DummyClient's shared staging memory per
            connection, through which put / get copy bytes (0: 64 MiB;
            pages are only used as bytes are written).  A larger call uses
            a one-off area of its size, so this bounds no value.  From 2 MiB
            up it also bounds the pinned memory through which device (GPU)
            buffers are staged in this process.
        mem_pool_size: accepted, not used (moonlet has no memory pool to
            allocate from; Store.alloc_buffer() is the zero-copy memory).
        Sizes may be ints or strings such as "512MB", as setup() takes them.
        tenant_id (moonlet's addition): tenant of every call; None: the
            RealClient's default tenant.

        Mooncake's form, the RealClient's "host:port", names the socket
        MOONLET_REALCLIENT_SOCKET gives, else /run/moonlet/realclient-PORT.sock
        (start the RealClient with --serve-dummy on that path).

        get_hostname() is "host:port" of that address afterwards (a socket
        path: "localhost:0"; this process contributes no memory).
        INVALID_PARAMS as well when this object is already set up.
        """
        if self._store is not None:
            return _INVALID_PARAMS
        if not isinstance(server_address, str) or not server_address:
            return _INVALID_PARAMS
        hostname = "localhost:0"
        if re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^/:\[\]]+):[0-9]{1,5}", server_address):
            hostname = server_address
            server_address = os.environ.get(
                "MOONLET_REALCLIENT_SOCKET",
                f"/run/moonlet/realclient-{server_address.rsplit(':', 1)[1]}.sock")
        try:
            parse_size(mem_pool_size)
            staging = parse_size(local_buffer_size)
        except (TypeError, ValueError):
            return _INVALID_PARAMS
        try:
            self._store = Store.connect_dummy(server_address, default_tenant=tenant_id,
                                              staging_bytes=staging,
                                              gpu_staging_size=_gpu_staging(staging))
        except StoreError as e:
            return e.code
        except (TypeError, ValueError):  # a NUL in the path, a size past 2**64
            return _INVALID_PARAMS
        self._hostname = hostname
        self._local_buffer = None
        self._memory = _Memory(self._store)
        return 0

    def close(self):
        """Disconnects (and withdraws the contributed memory).  Returns 0.
        With BufferHandles of get_buffer() still alive, later calls fail
        at once and the connection goes with the last handle."""
        if self._store is not None:
            memory, self._store, self._memory = self._memory, None, None
            with self._lock:
                self._regions.clear()
                self._sessions.clear()
            memory.close()
        return 0

    def get_hostname(self):
        """"host:port" of this client: local_hostname with its port, or,
        when it names none (or 0), a port picked as Mooncake picks one: free
        now, in 12300-14300 (HOSTNAME_PORT_RANGE).  The contributed memory is
        served on that port (a pure client serves nothing there).  After
        setup_dummy() the RealClient's "host:port" as given ("localhost:0"
        for a socket path).  "" before setup."""
        return self._hostname

    # ---- helpers ----------------------------------------------------------------

    def _call(self, fn, *args, **kwargs):
        """(value, 0) of a Store call, or (None, negative code)."""
        if self._store is None:
            return None, _UNAVAILABLE
        try:
            return fn(*args, **kwargs), 0
        except StoreError as e:
            return None, e.code

    @staticmethod
    def _put_kwargs(config):
        if config is None:
            return {}
        kw = {"replica_num": int(config.replica_num), "soft_pin": config._soft_pin()}
        names = [config.preferred_segment] if config.preferred_segment else []
        names += [n for n in config.preferred_segments if n and n not in names]
        if names:
            kw["preferred_segments"] = names
        if config.with_hard_pin:
            kw["hard_pin"] = True
        if config.soft_pin_ttl_ms:  # None: unset; 0: the master's default
            kw["soft_pin_ttl_ms"] = int(config.soft_pin_ttl_ms)
        return kw

    def _batch(self, n, fn, *args, **kwargs):
        """Per-key ints of a batch call: its results, or the error for every key."""
        if self._store is None:
            return [_UNAVAILABLE] * n
        try:
            return list(fn(*args, **kwargs))
        except StoreError as e:
            return list(e.results) if e.results is not None else [e.code] * n

    # ---- objects ------------------------------------------------------------------

    def _no_local_buffer(self):
        return self._store is not None and self._local_buffer == 0

    @staticmethod
    def _config_refused(config):
        """INVALID_PARAMS for a ReplicateConfig moonlet cannot send (names
        that are not str, more than 64 of them, a negative TTL, an unknown
        soft_pin_action) or Mooncake refuses (soft_pin_ttl_ms set without
        soft_pin_action ENABLE), else 0."""
        if config is None:
            return 0
        names = [config.preferred_segment] + list(config.preferred_segments)
        ttl = config.soft_pin_ttl_ms
        if (not all(isinstance(n, str) for n in names) or len(names) > 65
                or (ttl is not None and (not isinstance(ttl, int) or ttl < 0))):
            _log.error("ReplicateConfig: bad preferred segments or soft_pin_ttl_ms")
            return _INVALID_PARAMS
        try:
            action = SoftPinAction(config.soft_pin_action)
        except ValueError:
            _log.error("ReplicateConfig: unknown soft_pin_action %r", config.soft_pin_action)
            return _INVALID_PARAMS
        if ttl is not None and action != SoftPinAction.ENABLE:
            _log.error("ReplicateConfig: soft_pin_ttl_ms needs soft_pin_action ENABLE")
            return _INVALID_PARAMS
        return 0

    def put(self, key, value, config=None):
        """Stores value (bytes-like).  0, or a negative code; 0 also when the
        key already exists (the object is left as it was)."""
        if self._no_local_buffer() or self._config_refused(config):
            return _INVALID_PARAMS
        _, rc = self._call(lambda: self._store.put(key, value, **self._put_kwargs(config)))
        return 0 if rc == _ALREADY_EXISTS else rc

    def upsert(self, key, value, config=None):
        """Stores value, replacing an existing object.  0, or a negative code."""
        if self._no_local_buffer() or self._config_refused(config):
            return _INVALID_PARAMS
        _, rc = self._call(lambda: self._store.upsert(key, value, **self._put_kwargs(config)))
        return rc

    def get(self, key):
        """The object's bytes; b"" when it is missing or cannot be read."""
        value, rc = self._call(lambda: self._store.get(key))
        return value if rc == 0 else b""

    def put_batch(self, keys, values, config=None):
        """Stores values[i] (bytes-like) under keys[i], every transfer in one
        batch.  0 when every key was stored or already existed (left as it
        was, as put does), else the first failed key's negative code (in key
        order; the other keys were stored).  Lists of different lengths:
        INVALID_PARAMS (-600), nothing stored.  The values are copied once
        (Mooncake copies them too)."""
        keys = _key_list(keys)
        if isinstance(values, (str, bytes, bytearray, memoryview)):
            raise TypeError("values must be a sequence of bytes-like objects, not one value")
        values = list(values)
        if self._store is None:
            return _UNAVAILABLE
        if len(keys) != len(values) or self._no_local_buffer() or self._config_refused(config):
            return _INVALID_PARAMS
        kw = self._put_kwargs(config)
        out = self._batch(len(keys), lambda: self._store.batch_put(keys, values, **kw)
                          or [0] * len(keys))
        return next((r for r in out if r != 0 and r != _ALREADY_EXISTS), 0)

    def get_batch(self, keys):
        """The bytes of each key, in order: b"" for a key that is missing or
        cannot be read (and for an empty object), as get() gives.  Every
        read goes in one batch; each object read is leased.  One entry per
        key (before setup too); [] gives [b""], as Mooncake's does."""
        keys = _key_list(keys)
        if not keys:
            return [b""]  # Mooncake's answer to an empty batch
        if self._store is None:
            return [b""] * len(keys)
        try:
            return self._store.batch_get(keys)
        except StoreError as e:
            if e.results is None:
                return [b""] * len(keys)
            return [r if isinstance(r, bytes) else b"" for r in e.results]

    def put_parts(self, key, *parts, config=None):
        """Stores the concatenation of the bytes-like parts as one object
        (copied once, with no intermediate bytes object).  0 (also for an
        existing key, left as it was) or a negative code.  No parts, or only
        empty ones, store an empty object, as put(key, b"") does (Mooncake's
        returns 0 and stores nothing)."""
        if self._no_local_buffer() or self._config_refused(config):
            return _INVALID_PARAMS
        _, rc = self._call(lambda: self._store.put_parts(key, *parts,
                                                         **self._put_kwargs(config)))
        return 0 if rc == _ALREADY_EXISTS else rc

    def get_size(self, key):
        """The object's size in bytes, or a negative code."""
        value, rc = self._call(lambda: self._store.get_size(key))
        return value if rc == 0 else rc

    def is_exist(self, key):
        """1 when the object exists (and leases it), 0 when not, or a negative code."""
        value, rc = self._call(lambda: self._store.is_exist(key))
        return int(value) if rc == 0 else rc

    def batch_is_exist(self, keys):
        """is_exist for each key: a list of 1 / 0 / negative codes."""
        keys = _key_list(keys)
        return self._batch(len(keys), lambda: self._store.batch_is_exist(keys, codes=True))

    def batch_probe_key(self, keys, policy=None):
        """moonlet's BatchProbeKey: a list of 1 / 0 / negative codes.

        policy is a moonlet.GrantLeasePolicy (None: NONE, nothing leased).
        An invalid policy gives INVALID_PARAMS (-600) for every key.
        """
        keys = _key_list(keys)
        return self._batch(len(keys), lambda: self._store.batch_probe_key(keys, policy,
                                                                          codes=True))

    def remove(self, key, force=False):
        """Removes the object: 0, or a negative code (OBJECT_HAS_LEASE -706
        while a read lease holds, unless force; REPLICA_IS_NOT_READY -703
        while its put is in progress, even with force).  With force a reader
        still transferring may read bytes placed there later, as with
        Mooncake's: for resets with no reads in flight."""
        if force:
            _, rc = self._call(lambda: self._store._remove_force(key))
        else:
            _, rc = self._call(lambda: self._store.remove(key))
        return rc

    def remove_all(self, force=False):
        """Removes every object of the tenant that holds no lease (with
        force: leased ones too; never one whose put is in progress): the
        count, or a negative code."""
        if force:
            value, rc = self._call(lambda: self._store._remove_all_force())
        else:
            value, rc = self._call(lambda: self._store.remove_all())
        return value if rc == 0 else rc

    # ---- zero-copy ------------------------------------------------------------------

    def register_buffer(self, buffer_ptr, size):
        """Registers [buffer_ptr, buffer_ptr + size) for the zero-copy calls:
        0 or a negative code.  Host memory of this process (readable and
        writable) or CUDA device memory (the driver's pointer attributes say
        so); anything else (an unmapped address, a range running past its
        device allocation) is INVALID_PARAMS (-600), checked before the
        store sees it."""
        if self._store is None:
            return _UNAVAILABLE
        if (isinstance(buffer_ptr, bool) or not isinstance(buffer_ptr, int)
                or not isinstance(size, int) or buffer_ptr <= 0 or size <= 0):
            return _INVALID_PARAMS
        if not _is_host_memory(buffer_ptr, size) and _device_of(buffer_ptr, size) < 0:
            _log.error("register_buffer(%#x, %d): neither host memory of this process "
                       "nor CUDA device memory", buffer_ptr, size)
            return _INVALID_PARAMS
        _, rc = self._call(lambda: self._store.register_buffer(buffer_ptr, size))
        if rc == 0:
            with self._lock:
                self._regions[buffer_ptr] = size
        return rc

    def unregister_buffer(self, buffer_ptr):
        """Unregisters the buffer at buffer_ptr: 0 or a negative code."""
        _, rc = self._call(lambda: self._store.unregister_buffer(buffer_ptr))
        if rc == 0:
            with self._lock:
                self._regions.pop(buffer_ptr, None)
        return rc

    def _registered(self, ptr, size):
        """True when [ptr, ptr + size) lies inside one registered buffer."""
        if (isinstance(ptr, bool) or not isinstance(ptr, int) or isinstance(size, bool)
                or not isinstance(size, int) or ptr < 0 or size < 0):
            return False
        with self._lock:
            return any(base <= ptr and ptr + size <= base + n
                       for base, n in self._regions.items())

    def put_from(self, key, buffer_ptr, size, config=None):
        """Stores size bytes of registered memory: 0 (also for an existing key) or a code."""
        if self._config_refused(config):
            return _INVALID_PARAMS
        _, rc = self._call(lambda: self._store.put_from(key, buffer_ptr, size,
                                                        **self._put_kwargs(config)))
        return 0 if rc == _ALREADY_EXISTS else rc

    def get_into(self, key, buffer_ptr, size):
        """Reads the object into registered memory: the bytes read, or a negative code."""
        value, rc = self._call(lambda: self._store.get_into(key, buffer_ptr, size))
        return value if rc == 0 else rc

    @staticmethod
    def _same_lengths(keys, *lists):
        try:
            return all(len(x) == len(keys) for x in lists)
        except TypeError:
            return False

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """put_from for each key: a list of 0 / negative codes (lists of
        different lengths: INVALID_PARAMS for every key)."""
        keys = _key_list(keys)
        if not self._same_lengths(keys, buffer_ptrs, sizes) or self._config_refused(config):
            return [_INVALID_PARAMS] * len(keys)
        kw = self._put_kwargs(config)
        out = self._batch(len(keys), lambda: self._store.batch_put_from(keys, buffer_ptrs, sizes,
                                                                         **kw) or [0] * len(keys))
        return [0 if r == _ALREADY_EXISTS else r for r in out]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """get_into for each key: a list of bytes read / negative codes
        (lists of different lengths: INVALID_PARAMS for every key)."""
        keys = _key_list(keys)
        if not self._same_lengths(keys, buffer_ptrs, sizes):
            return [_INVALID_PARAMS] * len(keys)
        return self._batch(len(keys), lambda: self._store.batch_get_into(keys, buffer_ptrs,
                                                                          sizes))

    # ---- several buffers per key -------------------------------------------------------

    def _multi_check(self, keys, all_ptrs, all_sizes):
        """Per key: None when its ranges are well formed and registered,
        else its code.  None overall when the lists do not match."""
        if not self._same_lengths(keys, all_ptrs, all_sizes):
            return None
        codes = []
        for ptrs, sizes in zip(all_ptrs, all_sizes):
            try:
                ok = (len(ptrs) == len(sizes) and len(ptrs) > 0
                      and all(self._registered(p, n) for p, n in zip(ptrs, sizes)))
            except TypeError:
                ok = False
            codes.append(None if ok else _INVALID_PARAMS)
        return codes

    def _multi_call(self, fn, keys, all_ptrs, all_sizes, **kw):
        """Runs fn on the keys whose ranges check out; the others keep their code."""
        if self._store is None:
            return [_UNAVAILABLE] * len(keys)
        codes = self._multi_check(keys, all_ptrs, all_sizes)
        if codes is None:
            return [_INVALID_PARAMS] * len(keys)
        go = [i for i, c in enumerate(codes) if c is None]
        if go:
            try:
                res = fn([keys[i] for i in go], [list(all_ptrs[i]) for i in go],
                         [list(all_sizes[i]) for i in go], **kw)
            except StoreError as e:  # the store was closed under the call
                res = [e.code] * len(go)
            for i, r in zip(go, res):
                codes[i] = r
        return codes

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Stores key i as the concatenation of the registered ranges
        (all_buffer_ptrs[i][j], all_sizes[i][j]), every key in one batch:
        a list of 0 / negative codes (0 also for an existing key).  A key
        with a range outside registered memory: INVALID_PARAMS; lists of
        different lengths: INVALID_PARAMS for every key.  The ranges are
        gathered through one staging copy on this side."""
        keys = _key_list(keys)
        if self._config_refused(config):
            return [_INVALID_PARAMS] * len(keys)
        out = self._multi_call(self._store._batch_put_multi if self._store else None, keys,
                               all_buffer_ptrs, all_sizes, **self._put_kwargs(config))
        return [0 if r == _ALREADY_EXISTS else r for r in out]

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """Reads key i and scatters its bytes over the registered ranges
        (all_buffer_ptrs[i][j], all_sizes[i][j]) in order, every key in one
        batch: a list of bytes read / negative codes (BUFFER_OVERFLOW -10
        when the object is larger than the ranges together).
        prefer_alloc_in_same_node is accepted and not used."""
        keys = _key_list(keys)
        return self._multi_call(self._store._batch_get_multi if self._store else None, keys,
                                all_buffer_ptrs, all_sizes)

    # ---- buffers the store owns: get_buffer ----------------------------------------------

    def _read_handles(self, keys):
        """A BufferHandle or None per key: the size of each object, memory
        of the store (shared with a RealClient, or registered) of that size,
        one batch of reads into it; a key whose object was replaced by one
        of another size in between is read again (3 rounds at most)."""
        out = [None] * len(keys)
        pending = list(range(len(keys)))
        for _ in range(3):
            if not pending or self._store is None:
                break
            store, memory = self._store, self._memory
            todo, sizes, shared = [], [], []
            for i in pending:
                try:
                    n = store.get_size(keys[i])
                    if n == 0:
                        out[i] = _handle_type(0)()
                        continue
                    buf = store.alloc_buffer(n)
                except StoreError:
                    continue
                todo.append(i)
                sizes.append(n)
                shared.append(buf)
            pending = []
            if not todo:
                break
            try:
                res = store.batch_get_into([keys[i] for i in todo],
                                           [b.address for b in shared], sizes)
            except StoreError as e:
                res = e.results if e.results is not None else [e.code] * len(todo)
            for i, n, buf, r in zip(todo, sizes, shared, res):
                if r == n:
                    out[i] = memory.adopt(buf, n)
                    continue
                buf.free()
                # grown (BUFFER_OVERFLOW) or shrunk (fewer bytes) since its
                # size was learnt: replaced in between; read it again
                if r == _BUFFER_OVERFLOW or (isinstance(r, int) and 0 <= r < n):
                    pending.append(i)
        return out

    def get_buffer(self, key):
        """The object's bytes as a BufferHandle (buffer protocol, ptr(),
        size()), read with no copy on this side into memory of the store;
        None when the object is missing or cannot be read."""
        if self._store is None:
            return None
        return self._read_handles([key])[0]

    def batch_get_buffer(self, keys):
        """get_buffer for each key, the reads in one batch: a BufferHandle
        or None per key (also on a DummyClient, where Mooncake's returns [])."""
        keys = _key_list(keys)
        if self._store is None:
            return [None] * len(keys)
        return self._read_handles(keys)

    # ---- ranges: get_into_ranges and the get sessions ----------------------------------

    def _objects(self, keys):
        """key -> bytes (or a negative code) for the distinct keys: from an
        open get session, else read now in one batch."""
        found, need = {}, []
        with self._lock:
            for k in dict.fromkeys(keys):
                if k in self._sessions:
                    found[k] = self._sessions[k][0]
                else:
                    need.append(k)
        if need:
            if self._store is None:
                found.update((k, _UNAVAILABLE) for k in need)
            else:
                try:
                    vals = self._store.batch_get(need)
                except StoreError as e:
                    vals = e.results if e.results is not None else [e.code] * len(need)
                found.update(zip(need, vals))
        return found

    def _copy_ranges(self, obj, ptrs, dst_offsets, src_offsets, sizes):
        """Copies obj[src:src + n] to ptr + dst for each range: a list of
        bytes copied / negative codes (INVALID_PARAMS for a range outside
        the object or outside registered memory)."""
        if isinstance(obj, int):
            return [obj] * len(sizes)
        out = []
        for ptr, dst, src, n in zip(ptrs, dst_offsets, src_offsets, sizes):
            if (not all(isinstance(v, int) and v >= 0 for v in (dst, src, n))
                    or src + n > len(obj) or not self._registered(ptr + dst, n)):
                out.append(_INVALID_PARAMS)
                continue
            if n:  # host or device memory (a driver copy for the latter)
                _moonlet.copy_into(ptr + dst, obj, src, n)
            out.append(n)
        return out

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Copies byte ranges of objects into registered buffers: for buffer
        i, key j, range k: all_sizes[i][j][k] bytes from offset
        all_src_offsets[i][j][k] of object all_keys[i][j] to buffer_ptrs[i] +
        all_dst_offsets[i][j][k].  Returns, in the same nesting, the bytes
        copied or a negative code per range.  Each object is read once, whole
        (or taken from an open get session), then its ranges are copied.

        Mooncake's shape whatever the input: one list per buffer, and in it
        one list per key of that buffer (all_keys[i]); a key whose offsets
        and sizes are missing or of different lengths gets [INVALID_PARAMS]
        (-600), a key asked no range gets [].  Buffers whose lists are not
        as many as buffer_ptrs get [] each."""
        n = len(buffer_ptrs)
        if not self._same_lengths(buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                                  all_sizes):
            return [[] for _ in range(n)]

        def ranges(dsts, srcs, sizes, j):
            """Key j's (dst, src, size) lists, or None when they do not match."""
            if j >= min(len(dsts), len(srcs), len(sizes)):
                return None
            d, s_, z = dsts[j], srcs[j], sizes[j]
            return (d, s_, z) if len(d) == len(s_) == len(z) else None

        wanted = [k for keys, dsts, srcs, sizes in zip(all_keys, all_dst_offsets,
                                                        all_src_offsets, all_sizes)
                  for j, k in enumerate(keys) if (r := ranges(dsts, srcs, sizes, j)) and r[2]]
        objs = self._objects(wanted) if wanted else {}
        out = []
        for ptr, keys, dsts, srcs, sizes in zip(buffer_ptrs, all_keys, all_dst_offsets,
                                                all_src_offsets, all_sizes):
            per_key = []
            for j, key in enumerate(keys):
                r = ranges(dsts, srcs, sizes, j)
                if r is None:
                    per_key.append([_INVALID_PARAMS])
                elif not r[2]:
                    per_key.append([])
                else:
                    per_key.append(self._copy_ranges(objs[key], [ptr] * len(r[2]), *r))
            out.append(per_key)
        return out

    def batch_get_session_start(self, keys):
        """Opens a get session per key: reads the object once (leasing it)
        and keeps its bytes in this process until batch_get_session_end,
        so the ranged reads that follow do not go to the store again.  A list
        of 0 / negative codes."""
        keys = _key_list(keys)
        if self._store is None:
            return [_UNAVAILABLE] * len(keys)
        objs = self._objects(keys)
        out = []
        with self._lock:
            for k in keys:
                obj = objs[k]
                if isinstance(obj, int):
                    out.append(obj)
                    continue
                entry = self._sessions.setdefault(k, [obj, 0])
                entry[1] += 1
                out.append(0)
        return out

    def batch_get_into_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes,
                                           all_src_offsets):
        """For key i, copies all_sizes[i][j] bytes from offset
        all_src_offsets[i][j] of its object to the registered
        all_buffer_ptrs[i][j]: per key the bytes copied (the sum of its
        sizes) or a negative code (the first failed range's).  Served from
        the key's get session when one is open."""
        keys = _key_list(keys)
        if not self._same_lengths(keys, all_buffer_ptrs, all_sizes, all_src_offsets):
            return [_INVALID_PARAMS] * len(keys)
        objs = self._objects(keys)
        out = []
        for key, ptrs, sizes, srcs in zip(keys, all_buffer_ptrs, all_sizes, all_src_offsets):
            if not (len(ptrs) == len(sizes) == len(srcs)):
                out.append(_INVALID_PARAMS)
                continue
            res = self._copy_ranges(objs[key], ptrs, [0] * len(ptrs), srcs, sizes)
            out.append(next((r for r in res if r < 0), sum(res)))
        return out

    def batch_get_session_end(self, keys):
        """Closes the keys' get sessions (a key started twice needs two
        ends).  Returns 0."""
        with self._lock:
            for k in _key_list(keys):
                entry = self._sessions.get(k)
                if entry is not None:
                    entry[1] -= 1
                    if entry[1] <= 0:
                        del self._sessions[k]
        return 0

    # ---- replicas --------------------------------------------------------------------

    @staticmethod
    def _replica_descs(entry):
        """ReplicaDescriptors of one entry of Store.batch_replicas()."""
        return [ReplicaDescriptor(ReplicaStatus.COMPLETE if r.get("status") == "COMPLETE"
                                  else ReplicaStatus.INITIALIZED,
                                  MemoryDescriptor(Descriptor(r.get("length", 0),
                                                              r.get("offset", 0),
                                                              r.get("endpoint", ""))),
                                  r.get("segment", ""), r.get("tier") == "disk")
                for r in entry.get("replicas", [])]

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor, ...]} for the keys that exist, one
        master call for all of them (BatchGetReplicaList, as Mooncake's
        BatchQuery): the readable replicas, each object found leased, as
        Mooncake's lookup leases it.  segment_name is the segment's id."""
        keys = _key_list(keys)
        if self._store is None or not keys:
            return {}
        try:
            entries = self._store.batch_replicas(keys)
        except StoreError:
            return {}
        return {k: self._replica_descs(e) for k, e in zip(keys, entries) if "error" not in e}

    def get_replica_desc(self, key):
        """The object's replicas: a list of ReplicaDescriptor ([] when it is
        missing or before setup); batch_get_replica_desc of one key."""
        return self.batch_get_replica_desc([key]).get(key, [])

    def __repr__(self):
        if self._store is None:
            return "<MooncakeDistributedStore (not set up)>"
        return f"<MooncakeDistributedStore {self._hostname!r} on {self._store!r}>"


# ProbeLeaseMode and GrantLeasePolicy for batch_probe_key, importable from here too.
__all__ += ["GrantLeasePolicy", "ProbeLeaseMode"]
