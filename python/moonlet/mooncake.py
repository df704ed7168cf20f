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

What is accepted but means nothing here: metadata_server (moonlet needs no
metadata service), setup()'s local_buffer_size (moonlet stages through
registered memory per call instead of a preallocated pool), setup_dummy()'s
mem_pool_size (moonlet has Store.alloc_buffer() instead of a pool),
ReplicateConfig.preferred_segment (placement is the master's),
remove(force=True) (moonlet has no forced remove: an object under a lease
stays, and OBJECT_HAS_LEASE comes back).
"""
import enum
import re

from . import GrantLeasePolicy, ProbeLeaseMode, Store, StoreError, _moonlet

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "parse_size"]

_INVALID_PARAMS = _moonlet.INVALID_PARAMS
_UNAVAILABLE = _moonlet.UNAVAILABLE_IN_CURRENT_STATUS
_ALREADY_EXISTS = _moonlet.OBJECT_ALREADY_EXISTS

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

    replica_num:       replicas on distinct store nodes (default 1).
    with_soft_pin:     soft-pin the object (default False).
    soft_pin_action:   a SoftPinAction; ENABLE / DISABLE override with_soft_pin.
    preferred_segment: accepted for compatibility; the master places replicas.
    """

    __slots__ = ("replica_num", "with_soft_pin", "soft_pin_action", "preferred_segment")

    def __init__(self, replica_num=1, with_soft_pin=False,
                 soft_pin_action=SoftPinAction.PRESERVE, preferred_segment=""):
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.soft_pin_action = soft_pin_action
        self.preferred_segment = preferred_segment

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
                f"preferred_segment={self.preferred_segment!r})")


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

    # ---- setup -----------------------------------------------------------------

    def setup(self, local_hostname, metadata_server=None,
              global_segment_size=DEFAULT_GLOBAL_SEGMENT_SIZE,
              local_buffer_size=DEFAULT_LOCAL_BUFFER_SIZE, protocol="tcp", device_name="",
              master_server_address=DEFAULT_MASTER_SERVER_ADDR, engine=None, *,
              tenant_id="default", rdma_devices=None, master_server_addr=None):
        """Connects to the master and, with global_segment_size > 0, contributes
        that much memory from this process.  Returns 0, or a negative code.

        Either the 7 positional arguments of Mooncake (local_hostname,
        metadata_server, global_segment_size, local_buffer_size, protocol,
        device_name, master_server_address) or one dict with those keys
        (also Mooncake's spellings rdma_devices / master_server_addr, and
        tenant_id); sizes may be ints or strings such as "16MB".
        metadata_server and local_buffer_size are accepted and not used;
        engine must be None.  A dict's unknown keys are ignored, as Mooncake
        does.
        """
        if isinstance(local_hostname, dict):
            return self._setup_dict(local_hostname)
        if rdma_devices is not None:
            device_name = rdma_devices
        if master_server_addr is not None:
            master_server_address = master_server_addr
        return self._setup(local_hostname, global_segment_size, local_buffer_size, protocol,
                           device_name, master_server_address, tenant_id, engine)

    def _setup_dict(self, config):
        def get(*names, default=None):
            for n in names:
                if n in config and config[n] is not None:
                    return config[n]
            return default

        return self._setup(str(get("local_hostname", default="")),
                           get("global_segment_size", default=DEFAULT_GLOBAL_SEGMENT_SIZE),
                           get("local_buffer_size", default=DEFAULT_LOCAL_BUFFER_SIZE),
                           str(get("protocol", default="tcp")),
                           str(get("rdma_devices", "device_name", default="")),
                           str(get("master_server_addr", "master_server_address",
                                   default=DEFAULT_MASTER_SERVER_ADDR)),
                           str(get("tenant_id", default="default")), None)

    def _setup(self, local_hostname, global_segment_size, local_buffer_size, protocol,
               device_name, master_addr, tenant_id, engine):
        if self._store is not None or engine is not None or not local_hostname:
            return _INVALID_PARAMS
        try:
            segment = parse_size(global_segment_size)
            parse_size(local_buffer_size)
        except (TypeError, ValueError):
            return _INVALID_PARAMS
        if protocol not in ("tcp", "rdma"):
            return _INVALID_PARAMS
        host, port = _split_host(local_hostname)
        listen = None
        if segment:
            listen = f"[{host}]:{port or 0}" if ":" in host else f"{host}:{port or 0}"
        try:
            self._store = Store.connect(master_addr, protocol=protocol, segment_size=segment,
                                        device=device_name or None, default_tenant=tenant_id,
                                        local_listen_addr=listen)
        except StoreError as e:
            return e.code
        except (TypeError, ValueError):
            return _INVALID_PARAMS
        endpoint = self._store.local_endpoint
        if endpoint:
            self._hostname = f"{host}:{endpoint.rsplit(':', 1)[1]}"
        else:
            self._hostname = local_hostname
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
            a one-off area of its size, so this bounds no value.
        mem_pool_size: accepted, not used (moonlet has no memory pool to
            allocate from; Store.alloc_buffer() is the zero-copy memory).
        Sizes may be ints or strings such as "512MB", as setup() takes them.
        tenant_id (moonlet's addition): tenant of every call; None: the
            RealClient's default tenant.

        get_hostname() is "" afterwards, as with Mooncake's DummyClient: the
        segment belongs to the RealClient, this process contributes none.
        INVALID_PARAMS as well when this object is already set up.
        """
        if self._store is not None:
            return _INVALID_PARAMS
        if not isinstance(server_address, str) or not server_address:
            return _INVALID_PARAMS
        try:
            parse_size(mem_pool_size)
            staging = parse_size(local_buffer_size)
        except (TypeError, ValueError):
            return _INVALID_PARAMS
        try:
            self._store = Store.connect_dummy(server_address, default_tenant=tenant_id,
                                              staging_bytes=staging)
        except StoreError as e:
            return e.code
        except (TypeError, ValueError):  # a NUL in the path, a size past 2**64
            return _INVALID_PARAMS
        self._hostname = ""
        return 0

    def close(self):
        """Disconnects (and withdraws the contributed memory).  Returns 0."""
        if self._store is not None:
            self._store.close()
            self._store = None
        return 0

    def get_hostname(self):
        """"host:port" of this client: local_hostname, with the port its
        contributed memory is served on when it contributes some.  "" after
        setup_dummy() (the RealClient holds the segment) and before setup."""
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
        return {"replica_num": int(config.replica_num), "soft_pin": config._soft_pin()}

    def _batch(self, n, fn, *args, **kwargs):
        """Per-key ints of a batch call: its results, or the error for every key."""
        if self._store is None:
            return [_UNAVAILABLE] * n
        try:
            return list(fn(*args, **kwargs))
        except StoreError as e:
            return list(e.results) if e.results is not None else [e.code] * n

    # ---- objects ------------------------------------------------------------------

    def put(self, key, value, config=None):
        """Stores value (bytes-like).  0, or a negative code; 0 also when the
        key already exists (the object is left as it was)."""
        _, rc = self._call(lambda: self._store.put(key, value, **self._put_kwargs(config)))
        return 0 if rc == _ALREADY_EXISTS else rc

    def upsert(self, key, value, config=None):
        """Stores value, replacing an existing object.  0, or a negative code."""
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
        if len(keys) != len(values):
            return _INVALID_PARAMS
        kw = self._put_kwargs(config)
        out = self._batch(len(keys), lambda: self._store.batch_put(keys, values, **kw)
                          or [0] * len(keys))
        return next((r for r in out if r != 0 and r != _ALREADY_EXISTS), 0)

    def get_batch(self, keys):
        """The bytes of each key, in order: b"" for a key that is missing or
        cannot be read (and for an empty object), as get() gives.  Every
        read goes in one batch; each object read is leased.  Always one entry
        per key (Mooncake's gives a lone b"" for [] or before setup)."""
        keys = _key_list(keys)
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
        while a read lease holds; force does not override it here)."""
        _, rc = self._call(lambda: self._store.remove(key))
        return rc

    def remove_all(self):
        """Removes every object that holds no lease: the count, or a negative code."""
        value, rc = self._call(lambda: self._store.remove_all())
        return value if rc == 0 else rc

    # ---- zero-copy ------------------------------------------------------------------

    def register_buffer(self, buffer_ptr, size):
        """Registers [buffer_ptr, buffer_ptr + size) for put_from / get_into: 0 or a code."""
        _, rc = self._call(lambda: self._store.register_buffer(buffer_ptr, size))
        return rc

    def unregister_buffer(self, buffer_ptr):
        """Unregisters the buffer at buffer_ptr: 0 or a negative code."""
        _, rc = self._call(lambda: self._store.unregister_buffer(buffer_ptr))
        return rc

    def put_from(self, key, buffer_ptr, size, config=None):
        """Stores size bytes of registered memory: 0 (also for an existing key) or a code."""
        _, rc = self._call(lambda: self._store.put_from(key, buffer_ptr, size,
                                                        **self._put_kwargs(config)))
        return 0 if rc == _ALREADY_EXISTS else rc

    def get_into(self, key, buffer_ptr, size):
        """Reads the object into registered memory: the bytes read, or a negative code."""
        value, rc = self._call(lambda: self._store.get_into(key, buffer_ptr, size))
        return value if rc == 0 else rc

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """put_from for each key: a list of 0 / negative codes."""
        keys = _key_list(keys)
        kw = self._put_kwargs(config)
        out = self._batch(len(keys), lambda: self._store.batch_put_from(keys, buffer_ptrs, sizes,
                                                                         **kw) or [0] * len(keys))
        return [0 if r == _ALREADY_EXISTS else r for r in out]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """get_into for each key: a list of bytes read / negative codes."""
        keys = _key_list(keys)
        return self._batch(len(keys), lambda: self._store.batch_get_into(keys, buffer_ptrs,
                                                                          sizes))

    def __repr__(self):
        if self._store is None:
            return "<MooncakeDistributedStore (not set up)>"
        return f"<MooncakeDistributedStore {self._hostname!r} on {self._store!r}>"


# ProbeLeaseMode and GrantLeasePolicy for batch_probe_key, importable from here too.
__all__ += ["GrantLeasePolicy", "ProbeLeaseMode"]
