//! Typed access to the pinned maps, opened by path from a short-lived plugin
//! process. Layout checks (key/value sizes) are aya's; the versioned pin path
//! keeps maps of another layout out of reach. The maps the ownership
//! protocol works on are opened together as `ownership::Store`.

use std::path::PathBuf;

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap};
use portmap_common::{
    CounterKey, CtEntry, CtKey, MappingCounters, MappingKey, MappingValue, ORPHANS_MAP,
    OWNER_PODS_MAP, OWNER_SANDBOXES_MAP, PodRecord, PortKey, SPECIFIC_PORTS_CAPACITY,
    SPECIFIC_PORTS_MAP, SandboxRecord, TraceFilter, capacity,
    conditions::{CONDITIONS_MAP, ConditionKey, Conditions},
    map_names,
};

use crate::dataplane::pinned::pin::PinLayout;

#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    #[error("cannot open pinned map {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: MapError,
    },
    #[error("cannot create the {map} map")]
    Create {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error(
        "pinned map {path} has key size {key_size} and value size {value_size}, this build expects {expected_key} and {expected_value}: it was made by an incompatible build; remove it with `ebpf-portmap uninstall` or use another pinRoot"
    )]
    Incompatible {
        path: PathBuf,
        key_size: u32,
        value_size: u32,
        expected_key: u32,
        expected_value: u32,
    },
    #[error("cannot map the {map} map into memory")]
    Mmap {
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("updating the {map} map failed")]
    Update {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("cannot take the mappings' writers lock")]
    Writers(#[from] crate::dataplane::pinned::lock::LockError),
}

pub fn open<T>(layout: &PinLayout, name: &str) -> Result<T, MapsError>
where
    T: TryFrom<Map, Error = MapError>,
{
    let path = layout.map(name);
    let fail = |source| MapsError::Open {
        path: path.clone(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(fail)?;
    let map = Map::from_map_data(data).map_err(fail)?;
    T::try_from(map).map_err(fail)
}

/// The conditions map, if the programs' load pinned it.
pub fn open_conditions(
    layout: &PinLayout,
) -> Result<Option<HashMap<MapData, ConditionKey, Conditions>>, MapsError> {
    if !layout.map(CONDITIONS_MAP).exists() {
        return Ok(None);
    }
    open(layout, CONDITIONS_MAP).map(Some)
}

/// The programs' `mappings_epoch` (see
/// [`portmap_common::maps::MAPPINGS_EPOCH`]): the tc programs' per-CPU cache
/// of the mappings that established flows re-check holds only while the
/// epoch stays where it was when the cache was filled. Mapped into this
/// process on the first raise only: most ADDs delete and re-point nothing.
pub struct MappingsEpoch {
    path: PathBuf,
    mapped: std::cell::OnceCell<Option<MappedArray>>,
}

impl MappingsEpoch {
    pub(crate) fn at(path: PathBuf) -> Self {
        Self {
            path,
            mapped: std::cell::OnceCell::new(),
        }
    }

    /// Raises the epoch. Call after a mapping was deleted or re-pointed, once
    /// the change is in the map: every cached copy of a mapping is then out
    /// of date, and the next packet of each flow looks its mapping up
    /// again. An atomic add, so two raises at once never count as one. A
    /// pin root without the epoch has programs of a build before it, which
    /// cache nothing. When the epoch cannot be reached, the cached copies
    /// expire by age within 64 ticks (see the eBPF crate's `cached_mapping`):
    /// logged, not an error of the verb, whose change is made.
    pub fn raise(&self) {
        let mapped = self.mapped.get_or_init(|| {
            if !self.path.exists() {
                return None;
            }
            MapData::from_pin(&self.path)
                .map_err(std::io::Error::other)
                .and_then(|data| Self::map(&data))
                .inspect_err(|error| {
                    log::warn!(
                        "cannot raise the mappings epoch {}: {error}; cached mappings expire within 64 ticks",
                        self.path.display()
                    );
                })
                .ok()
        });
        if let Some(words) = mapped {
            Self::raise_mapped(words);
        }
    }

    /// The epoch of `map` (the pinned one, or a loaded object's), mapped
    /// into this process.
    pub fn map(map: &MapData) -> std::io::Result<MappedArray> {
        MappedArray::of(map, 1)
    }

    /// Raises the epoch held in `words` (see [`MappingsEpoch::map`]).
    pub fn raise_mapped(words: &MappedArray) {
        words
            .word(0)
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The values of a `BPF_F_MMAPABLE` array of `u64`, mapped into this
/// process and reached only through atomics: concurrent writers (plugin
/// runs, the programs) never undo each other's updates, which a
/// read-modify-write through the map syscalls would. Unmapped on drop.
pub struct MappedArray {
    words: std::ptr::NonNull<std::sync::atomic::AtomicU64>,
    len: usize,
}

// SAFETY: the mapping is shared memory reached only through atomics.
unsafe impl Send for MappedArray {}
// SAFETY: as above.
unsafe impl Sync for MappedArray {}

impl MappedArray {
    /// Maps the first `len` values of `map`; fails (EINVAL) when the map
    /// has fewer, or was not made `BPF_F_MMAPABLE`.
    pub fn of(map: &MapData, len: usize) -> std::io::Result<Self> {
        use std::os::fd::{AsFd, AsRawFd};
        // SAFETY: a shared read-write mapping of the map's values, which
        // the kernel refuses when longer than the map; the fd is valid for
        // the call and the mapping outlives it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * size_of::<u64>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let words = std::ptr::NonNull::new(ptr.cast())
            .ok_or_else(|| std::io::Error::other("mmap returned NULL"))?;
        Ok(Self { words, len })
    }

    /// Value `index`; panics past the mapped length.
    pub fn word(&self, index: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(index < self.len, "value {index} of {}", self.len);
        // SAFETY: in bounds of a live, page-aligned mapping of `len` u64s,
        // which the kernel and other processes touch only atomically.
        unsafe { &*self.words.as_ptr().add(index) }
    }
}

/// Whether mappings are left for the process's exit to take down.
static LEAVE_TO_EXIT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// For a process that exits right after its work (the CNI plugin): from
/// now on a dropped [`MappedArray`] is not unmapped, exit takes the whole
/// address space down at once. An `munmap` flushes the TLB of every CPU
/// the process ran on, an inter-processor interrupt per CPU, and on a VM
/// each costs a VM exit: the bench measured ADD p50 0.89x of the build
/// before the agent without the verb record's `munmap`, 1.04x with it.
/// Long-running processes (the agent, which maps `verb_stats` on every
/// scrape) must not call this.
pub fn leave_mappings_to_exit() {
    LEAVE_TO_EXIT.store(true, std::sync::atomic::Ordering::Relaxed);
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        if LEAVE_TO_EXIT.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // SAFETY: the mapping made in `of`, unmapped once.
        unsafe { libc::munmap(self.words.as_ptr().cast(), self.len * size_of::<u64>()) };
    }
}

/// The programs' `mapped_ports` bit array, mapped into this process (see
/// [`MappedArray`]), so that ADD sets bits with an atomic OR.
pub struct MappedPorts(MappedArray);

impl MappedPorts {
    /// Maps the bit array of `map` (the pinned one, or a loaded object's).
    pub fn of(map: &MapData) -> Result<Self, MapsError> {
        MappedArray::of(map, capacity::MAPPED_PORTS as usize)
            .map(Self)
            .map_err(|source| MapsError::Mmap {
                map: map_names::MAPPED_PORTS,
                source,
            })
    }

    /// Sets the bits of both ports of a mapping (host and container port).
    /// Call before the mapping is written: the programs leave a packet
    /// alone when its ports have no bit, so a mapping whose bits are
    /// missing would not be translated. Returns whether a bit was missing.
    pub fn mark(&self, key: &MappingKey, value: &MappingValue) -> bool {
        use portmap_common::{PortRole, mapped_port_bit};
        let mut was_missing = false;
        for (role, port_be) in [
            (PortRole::Host, key.host_port_be),
            (PortRole::Container, value.container_port_be),
        ] {
            let Some((word, bit)) = mapped_port_bit(role, key.proto, port_be) else {
                continue;
            };
            let before = self
                .0
                .word(word as usize)
                .fetch_or(bit, std::sync::atomic::Ordering::SeqCst);
            was_missing |= before & bit == 0;
        }
        was_missing
    }
}

/// A hash map that userspace creates (the eBPF object does not declare
/// it): its pin name, key and value size and capacity.
pub struct UserMap {
    pub name: &'static str,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
}

/// Pod identity by owner ID.
pub const PODS: UserMap = UserMap {
    name: OWNER_PODS_MAP,
    key_size: size_of::<u64>() as u32,
    value_size: size_of::<PodRecord>() as u32,
    max_entries: capacity::OWNERS,
};

/// Each owner's sandbox (network namespace, pod UID) by owner ID.
pub const SANDBOXES: UserMap = UserMap {
    name: OWNER_SANDBOXES_MAP,
    key_size: size_of::<u64>() as u32,
    value_size: size_of::<SandboxRecord>() as u32,
    max_entries: capacity::OWNERS,
};

/// Ports a specific host address was ever claimed on.
pub const SPECIFIC_PORTS: UserMap = UserMap {
    name: SPECIFIC_PORTS_MAP,
    key_size: size_of::<PortKey>() as u32,
    value_size: size_of::<u32>() as u32,
    max_entries: SPECIFIC_PORTS_CAPACITY,
};

/// First sighting of each orphaned owner ID.
pub const ORPHANS: UserMap = UserMap {
    name: ORPHANS_MAP,
    key_size: size_of::<u64>() as u32,
    value_size: size_of::<u64>() as u32,
    max_entries: capacity::OWNERS,
};

/// Each owner's registered container namespace (`containerSockets`), by
/// owner ID (see `dataplane::node_maps::container_netns`).
pub const OWNER_NETNS: UserMap = UserMap {
    name: portmap_common::local::OWNER_NETNS_MAP,
    key_size: size_of::<u64>() as u32,
    value_size: size_of::<portmap_common::local::NetnsRegistration>() as u32,
    max_entries: capacity::CONTAINER_NETNS,
};

/// A pinned user map if it exists (checked to have this build's layout).
/// One open: the sizes aya reads when it opens the pin are the ones
/// checked; only a map of another layout is asked for its sizes again, for
/// the message.
pub fn open_user_map<K: aya::Pod, V: aya::Pod>(
    layout: &PinLayout,
    spec: &UserMap,
) -> Result<Option<HashMap<MapData, K, V>>, MapsError> {
    let path = layout.map(spec.name);
    let fail = |source| MapsError::Open {
        path: path.clone(),
        source,
    };
    let data = match MapData::from_pin(&path) {
        Ok(data) => data,
        Err(error) if is_errno(&error, libc::ENOENT) => return Ok(None),
        Err(source) => return Err(fail(source)),
    };
    match Map::from_map_data(data).and_then(HashMap::try_from) {
        Ok(map) => Ok(Some(map)),
        Err(MapError::InvalidKeySize { .. } | MapError::InvalidValueSize { .. }) => {
            let info = aya::maps::MapInfo::from_pin(&path).map_err(fail)?;
            Err(MapsError::Incompatible {
                path: path.clone(),
                key_size: info.key_size(),
                value_size: info.value_size(),
                expected_key: spec.key_size,
                expected_value: spec.value_size,
            })
        }
        Err(source) => Err(fail(source)),
    }
}

/// Creates and pins the pod map unless it is pinned already, and opens it.
pub fn create_pods(layout: &PinLayout) -> Result<HashMap<MapData, u64, PodRecord>, MapsError> {
    create_user_map(layout, &PODS).map(|(map, _)| map)
}

/// Creates and pins the sandbox map unless it is pinned already, and opens it.
pub fn create_sandboxes(
    layout: &PinLayout,
) -> Result<HashMap<MapData, u64, SandboxRecord>, MapsError> {
    create_user_map(layout, &SANDBOXES).map(|(map, _)| map)
}

/// Creates and pins a user map unless it is pinned already, and opens it;
/// `true` when this call created it.
///
/// Created here, not by the eBPF loader: the programs never read these
/// maps, and a node upgraded from a build without one must get it on the
/// first ADD by this build, whatever the state of the programs. Safe
/// against concurrent ADDs without the lock: pinning is an atomic create,
/// the loser's map is dropped and the winner's opened.
pub fn create_user_map<K: aya::Pod, V: aya::Pod>(
    layout: &PinLayout,
    spec: &UserMap,
) -> Result<(HashMap<MapData, K, V>, bool), MapsError> {
    if let Some(map) = open_user_map(layout, spec)? {
        return Ok((map, false));
    }
    let name = spec.name;
    let definition = user_map_definition(
        aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_HASH,
        (spec.key_size, spec.value_size),
        spec.max_entries,
        aya_obj::generated::BPF_F_NO_PREALLOC,
    );
    let create = |source| MapsError::Create { map: name, source };
    let data = MapData::create(definition, name, None).map_err(create)?;
    match data.pin(layout.map(name)) {
        Ok(()) => {
            let map = Map::from_map_data(data).map_err(create)?;
            HashMap::try_from(map)
                .map_err(create)
                .map(|map| (map, true))
        }
        // Another ADD pinned one first: use that one.
        Err(aya::pin::PinError::SyscallError(error))
            if error.io_error.raw_os_error() == Some(libc::EEXIST) =>
        {
            match open_user_map(layout, spec)? {
                Some(map) => Ok((map, false)),
                None => open(layout, name).map(|map| (map, false)),
            }
        }
        Err(error) => Err(create(MapError::PinError {
            name: Some(name.to_owned()),
            error,
        })),
    }
}

/// The definition of a map this process makes itself (no eBPF object
/// declares it: the user maps above, the namespace's owner record, the
/// verbs' counters): its type, (key, value) sizes, capacity and flags,
/// the loader's bookkeeping fields empty.
pub fn user_map_definition(
    map_type: aya_obj::generated::bpf_map_type,
    (key_size, value_size): (u32, u32),
    max_entries: u32,
    map_flags: u32,
) -> aya_obj::Map {
    aya_obj::Map::Legacy(aya_obj::maps::LegacyMap {
        def: aya_obj::maps::bpf_map_def {
            map_type: map_type as u32,
            key_size,
            value_size,
            max_entries,
            map_flags,
            id: 0,
            pinning: aya_obj::maps::PinningType::None,
        },
        inner_def: None,
        section_index: 0,
        section_kind: aya_obj::EbpfSectionKind::Maps,
        symbol_index: None,
        data: Vec::new(),
    })
}

/// A conntrack table (`map_names::CONNTRACK`, `CONNTRACK_CLOSED`,
/// `CONNTRACK_OTHER` or `CONNTRACK_NEW`), opened only by the verbs that
/// look at flows.
pub fn conntrack(
    layout: &PinLayout,
    table: &'static str,
) -> Result<HashMap<MapData, CtKey, CtEntry>, MapsError> {
    open(layout, table)
}

/// Per-CPU counters by reason.
pub fn stats(layout: &PinLayout) -> Result<PerCpuArray<MapData, u64>, MapsError> {
    open(layout, map_names::STATS)
}

/// Per-mapping traffic counters, see [`crate::dataplane::observe::counters`].
pub fn counters(
    layout: &PinLayout,
) -> Result<PerCpuHashMap<MapData, CounterKey, MappingCounters>, MapsError> {
    open(layout, map_names::COUNTERS)
}

/// Per-mapping socket-hook counters (`sock_counters`), see
/// [`crate::dataplane::observe::counters`]; missing in pins of a build before them.
pub fn sock_counters(
    layout: &PinLayout,
) -> Result<PerCpuHashMap<MapData, CounterKey, portmap_common::local::SockCounters>, MapsError> {
    open(layout, portmap_common::local::map_names::SOCK_COUNTERS)
}

/// What `ebpf-portmap trace` asks the programs for, see [`crate::dataplane::observe::trace`].
pub fn trace_filter(layout: &PinLayout) -> Result<Array<MapData, TraceFilter>, MapsError> {
    open(layout, map_names::TRACE_FILTER)
}

/// Whether the error of a map call is the kernel's errno `code`.
pub fn is_errno(error: &MapError, code: i32) -> bool {
    match error {
        MapError::SyscallError(e) => e.io_error.raw_os_error() == Some(code),
        MapError::KeyNotFound | MapError::ElementNotFound => code == libc::ENOENT,
        _ => false,
    }
}

/// Entries of a hash-type map, counted by walking its keys with
/// `BPF_MAP_GET_NEXT_KEY` (one syscall per entry: about a second for a
/// quarter million conntrack entries). Works for any key type, so maps
/// this module does not know are counted too.
pub fn count_keys(fd: std::os::fd::BorrowedFd<'_>, key_size: u32) -> Option<u64> {
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    let mut key = vec![0u8; key_size as usize];
    let mut next = vec![0u8; key_size as usize];
    let mut count = 0u64;
    let mut first = true;
    loop {
        let from = if first {
            std::ptr::null()
        } else {
            key.as_ptr()
        };
        // SAFETY: both buffers are of the map's key size and live across
        // the call; the kernel reads `key` and writes `next`.
        let step = unsafe {
            crate::dataplane::pinned::bpf_call::map_elem(
                BPF_MAP_GET_NEXT_KEY,
                fd,
                from,
                next.as_mut_ptr(),
            )
        };
        if let Err(error) = step {
            return (error.raw_os_error() == Some(libc::ENOENT)).then_some(count);
        }
        count += 1;
        std::mem::swap(&mut key, &mut next);
        first = false;
    }
}
