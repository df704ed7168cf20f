"""moonlet - Python binding of the moonlet distributed KV-cache store.

A Store is one connection to a moonlet cluster, made either directly (the C
Client: talks to the master, moves bytes to and from store nodes itself) or
through a RealClient process (a DummyClient: every call goes over a unix
socket to the RealClient, which runs the Client)::

    import moonlet
    s = moonlet.Store.connect("127.0.0.1:50051", protocol="tcp")
    s.put("k", b"bytes")
    s.get("k")                                    # -> b"bytes"
    policy = moonlet.GrantLeasePolicy(moonlet.ProbeLeaseMode.LAST_HIT_ONLY, 2)
    s.batch_probe_key(["a/0", "a/1", "b/0", "b/1"], policy=policy)

Every failure raises moonlet.StoreError with .code, Mooncake's numeric error
code.  Calls release the GIL while they wait on the network.
`moonlet.mooncake` has Mooncake Store's own Python class on top of this.
See docs/python.md.
"""
import enum
import json
from pkgutil import extend_path

# The pure-Python modules and the built extension may sit in different
# directories (a source tree plus a build tree on PYTHONPATH).
__path__ = extend_path(__path__, __name__)

from .errors import StoreError  # noqa: E402  (before the extension, which imports it)
from . import _moonlet  # noqa: E402

__all__ = ["Store", "StoreError", "GrantLeasePolicy", "ProbeLeaseMode", "SharedBuffer",
           "strerror"]
__version__ = "0.1.0"

strerror = _moonlet.strerror
SharedBuffer = _moonlet.SharedBuffer


class ProbeLeaseMode(enum.IntEnum):
    """lease_mode of a GrantLeasePolicy (moonlet_probe_lease_mode)."""

    NONE = 0
    """Point-in-time existence per key; nothing is leased."""
    LAST_HIT_ONLY = 1
    """Lease only the last complete candidate; the result is a selected-only mask."""


_U8_MAX = (1 << 8) - 1
_U64_MAX = (1 << 64) - 1


def _check_uint(name, value, maximum):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be int, not {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise ValueError(f"{name} {value} does not fit its wire type (0..{maximum})")
    return int(value)


def _probe_lease_mode(value):
    """A ProbeLeaseMode, or the raw int when it names no known mode."""
    try:
        return ProbeLeaseMode(value)
    except ValueError:
        return value


def _uint_property(slot, name, maximum, convert, doc):
    """An attribute kept in `slot` that takes an int 0..maximum (_check_uint),
    stored as convert(value)."""

    def fget(self):
        return getattr(self, slot)

    def fset(self, value):
        setattr(self, slot, convert(_check_uint(name, value, maximum)))

    return property(fget, fset, doc=doc)


class GrantLeasePolicy:
    """The lease policy of batch_probe_key (moonlet_grant_lease_policy).

    lease_mode:     a ProbeLeaseMode (or any int 0..255: the wire type).
    candidate_size: keys per candidate for LAST_HIT_ONLY (int 0..2**64-1).

    Only the types are checked here.  Whether the values make sense is the
    master's call: an unknown mode, a candidate_size of 0, or one that does
    not divide the number of keys come back from batch_probe_key as
    StoreError code -600 (INVALID_PARAMS).
    """

    __slots__ = ("_mode", "_size")

    def __init__(self, lease_mode=ProbeLeaseMode.NONE, candidate_size=1):
        self.lease_mode = lease_mode
        self.candidate_size = candidate_size

    lease_mode = _uint_property(
        "_mode", "lease_mode", _U8_MAX, _probe_lease_mode,
        "A ProbeLeaseMode, or the raw int when it names no known mode.")
    candidate_size = _uint_property(
        "_size", "candidate_size", _U64_MAX, int,
        "Keys per candidate (LAST_HIT_ONLY); ignored by NONE.")

    def __repr__(self):
        mode = self._mode
        mode_s = f"ProbeLeaseMode.{mode.name}" if isinstance(mode, ProbeLeaseMode) else str(mode)
        return f"GrantLeasePolicy(lease_mode={mode_s}, candidate_size={self._size})"

    def __eq__(self, other):
        if not isinstance(other, GrantLeasePolicy):
            return NotImplemented
        return (int(self._mode), self._size) == (int(other._mode), other._size)

    def __hash__(self):
        return hash((int(self._mode), self._size))


class Store(_moonlet.Client):
    """One connection to a moonlet cluster.

    Make one with Store.connect() (directly to a master) or
    Store.connect_dummy() (through a RealClient process).  Calls may come
    from many threads at once.  Objects live in tenants (separate name
    spaces): tenant_id=None means the connection's default tenant.

    Errors raise StoreError; a per-key error inside a batch raises too (with
    .results), so an error never reads as False.  Use as a context manager to
    close on exit.
    """

    __slots__ = ()

    def __init__(self, *args, **kwargs):
        raise TypeError("use moonlet.Store.connect(...) or moonlet.Store.connect_dummy(...)")

    @classmethod
    def connect(cls, master_addr, protocol="auto", segment_size=0, *, device=None,
                auth_token=None, default_tenant=None, replica_num=1, rpc_timeout_ms=0,
                transfer_timeout_ms=0, local_listen_addr=None, checksum=True, http_port=None,
                http_address=None, gpu_staging_size=0, tls_ca=None, tls_cert=None,
                tls_key=None, disk_path=None, disk_size=0):
        """Connects to the master at master_addr ("HOST:PORT").  With HA,
        master_addr lists every master: "HOST:PORT,HOST:PORT" or a list of
        "HOST:PORT" strings; the client follows the leader.

        protocol:       "auto" (RDMA when a device with an active port exists,
                        else TCP), "tcp" or "rdma".
        segment_size:   bytes of memory this process contributes to the
                        cluster (served on local_listen_addr, default
                        127.0.0.1 and any port); 0 makes a pure client.
        device:         RDMA device name (None: the first active one).
        auth_token:     the cluster's shared token (None: none).
        default_tenant: tenant of calls without tenant_id ("default").
        replica_num:    replicas per put unless a put says otherwise.
        rpc_timeout_ms, transfer_timeout_ms: 0 means 10000.
        checksum:       True (default): every put records an XXH3-64 of its
                        bytes and every get verifies it, falling over to the
                        next replica on a mismatch (StoreError INVALID_READ
                        when none matches).  False skips both (one pass over
                        the bytes less per call).
        tls_ca:         TLS to the master (None: plaintext): the PEM CA file
                        the master's certificate must be signed by.
        tls_cert, tls_key: this client's PEM certificate and key, for a
                        master that requires client certificates.
        http_port:      None (default): no HTTP endpoint.  A port (0: a free
                        one): this client serves GET /metrics (Prometheus
                        text: puts, gets, bytes, hits, misses, latency
                        histograms, errors by code) and GET /health there,
                        on http_address (None: every IPv4 address), with
                        auth_token required as a Bearer token when set;
                        Store.http_port is the port bound.
        gpu_staging_size: bytes of pinned host memory through which device
                        (GPU) buffers are staged (0: 128 MiB); see
                        docs/python.md, "GPU memory".
        disk_path:      with segment_size: a disk tier behind this process's
                        segment (a file, a block device or a directory;
                        comma-separated for several): objects evicted from
                        DRAM may be demoted there, and a restart with the
                        same path brings them back.  disk_size: its bytes
                        (0: 4 x segment_size, at least 64 MiB).

        Raises StoreError: RPC_FAIL (-900) when the master cannot be reached,
        ILLEGAL_CLIENT (-601) for a refused token, INVALID_PARAMS (-600),
        INTERNAL_ERROR (-1) when the HTTP endpoint cannot listen.
        """
        self = cls.__new__(cls)
        if isinstance(master_addr, (list, tuple)):
            master_addr = ",".join(master_addr)
        self._connect(master_addr, protocol, segment_size, device, auth_token, default_tenant,
                      replica_num, rpc_timeout_ms, transfer_timeout_ms, local_listen_addr,
                      checksum=checksum, http_server=http_port is not None,
                      http_port=http_port or 0, http_address=http_address,
                      gpu_staging_size=gpu_staging_size, tls_ca=tls_ca, tls_cert=tls_cert,
                      tls_key=tls_key, disk_path=disk_path, disk_size=disk_size)
        return self

    @classmethod
    def connect_dummy(cls, socket_path, *, default_tenant=None, rpc_timeout_ms=0,
                      staging_bytes=0, max_connections=0, peer_uid=None, peer_gid=None,
                      gpu_staging_size=0):
        """Connects through the RealClient serving on socket_path (a DummyClient).

        A RealClient is a moonlet-store started with --serve-dummy PATH; it
        runs the one real client of the host and makes every call of this
        Store on it, with object bytes in shared memory.  The API is the same
        as a direct Store's; local_endpoint is None (the RealClient holds the
        segment).

        default_tenant:  tenant of calls without tenant_id (None: the
                         RealClient's default).
        rpc_timeout_ms:  longest wait for one RealClient answer (0: 30000).
        staging_bytes:   shared staging memory per connection (0: 64 MiB).
        max_connections: calls that may run at once (0: 4).
        peer_uid:        the uid the RealClient must run as (None: this
                         process's); root is always accepted.
        peer_gid:        also accept a RealClient running with this group.
        gpu_staging_size: as for connect(): device buffers are staged in
                         this process, into shared memory the RealClient
                         reads in place.

        Raises StoreError: RPC_FAIL (-900) when nothing listens on the path,
        INVALID_PARAMS (-600) for a path too long for a unix socket,
        ILLEGAL_CLIENT (-601) when the process on the socket is neither root
        nor the expected uid/gid (checked before anything is sent).
        """
        self = cls.__new__(cls)
        self._connect_dummy(socket_path, default_tenant, rpc_timeout_ms, staging_bytes,
                            max_connections, peer_uid, peer_gid, gpu_staging_size)
        return self

    def inspect(self, key, *, tenant_id=None):
        """What the master holds for key, as a dict (the master's InspectKey).

        Keys: key, size, complete, replica_count, readable_replicas,
        lease_remaining_ms (0 when no read lease holds), soft_pinned (bool),
        soft_pin_remaining_ms, and replicas: a list of dicts with segment
        (the segment id), segment_name, endpoint, protocol, offset, length
        and status ("COMPLETE" or "INITIALIZED").  Never grants a lease.
        Raises StoreError OBJECT_NOT_FOUND (-704) for an absent key.
        """
        doc = json.loads(self._inspect_json(key, tenant_id=tenant_id))
        replicas = []
        for r in doc.get("replicas", []):
            r = dict(r)
            r["segment"] = r.pop("segment_id", None)
            replicas.append(r)
        doc["replicas"] = replicas
        doc["soft_pinned"] = doc.get("soft_pin_remaining_ms", 0) > 0
        return doc

    def batch_replicas(self, keys, *, tenant_id=None):
        """The readable replicas of many keys, one master call for all of
        them (BatchGetReplicaList; each object found is leased, as a get's
        lookup leases it): a list with one entry per key, in order, either
        {"size", "replicas": [{segment, endpoint, protocol, offset, length,
        status}...]} or {"error": code} (OBJECT_NOT_FOUND -704, ...).
        """
        out = json.loads(self._batch_replicas_json(list(keys), tenant_id=tenant_id))
        for e in out:
            for r in e.get("replicas", []):
                r["segment"] = r.pop("segment_id", None)
        return out

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __repr__(self):
        name = f"{type(self).__module__}.{type(self).__qualname__}"
        if self.closed:
            return f"<{name} closed ({self.kind} {self.target!r})>"
        where = "master" if self.kind == "direct" else "realclient"
        extra = f" segment={self.local_endpoint}" if self.local_endpoint else ""
        return (f"<{name} {self.kind} {where}={self.target!r} protocol={self.protocol} "
                f"tenant={self.default_tenant!r}{extra}>")
