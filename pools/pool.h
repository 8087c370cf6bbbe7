// The structures every pool shares: Slice and Page nodes with Boost.Intrusive hooks, the
// size-binned free set, the address-ordered page set, the per-manager PoolContext (device,
// node slabs, reservation clock), and the Pool base class that owns page bookkeeping, usage
// counters and idle-page release. The concrete pools (sliced_pool.h, page_pools.h) only decide
// where a request goes inside their pages. Nothing here locks: the MemoryManager's mutex covers
// every call. Depends on device.h, report.h and slab.h; never on the manager.
#pragma once

#include <boost/container/small_vector.hpp>
#include <boost/intrusive/list.hpp>
#include <boost/intrusive/set.hpp>
#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "pools/device.h"
#include "pools/free_bins.h"
#include "pools/report.h"
#include "pools/slab.h"
#include "pools/types.h"

namespace poolcuda {

namespace bi = boost::intrusive;
using FastLink = bi::link_mode<bi::normal_link>;

// free: in its pool's free set. live: handed out, indexed by pointer. pending: freed, waiting
// for its free fence. held: freed by the program while pinned (MemoryManager::retain).
enum class SliceState : std::uint8_t { free, live, pending, held };

class Pool;
struct Page;
class ThreadCache;
class SliceIndex;

// One record per slice, exactly one cache line (Note [One line per slice]).
struct alignas(64) Slice {
  bi::list_member_hook<FastLink> page_hook;  // neighbours in address order within the page
  Page* page = nullptr;
  DevicePtr ptr = 0;
  std::uint64_t size = 0;  // bytes the slice occupies: a multiple of the alignment
  // What each state needs, and only while the slice is in it.
  union {
    Slice* free_prev = nullptr;  // free: the pool's free bins (free_bins.h)
    Slice* next_pending;         // pending: the free-fence epoch chain
    // Live and held: the thread's cache that holds it, or nullptr (Note [Thread caches] in
    // manager_caches.cpp).
    ThreadCache* cache;
  };
  union {
    Slice* free_next = nullptr;  // free: the pool's free bins
    std::uint64_t requested;     // live and held: the size the program asked for
  };
  std::uint32_t pins = 0;
  SliceState state = SliceState::free;
  // Whether the page neighbour before (after) it is free, exactly, so that a free with both
  // clear reads neither (Note [Free neighbours marked] in sliced_pool.cpp). Carved pools only;
  // bytes of their own, so that setting one is a plain store.
  std::uint8_t free_before = 0;
  std::uint8_t free_after = 0;
  union {
    // Held: the manager's held era when the program freed it (Note [Releases inside a window]
    // in manager_api.cpp).
    std::uint8_t held_era = 0;
    // Pending and free: its free was the program's stream-ordered one (Note [Idle memory before
    // a park] in memory_manager.cpp); Pool::to_pending clears it.
    std::uint8_t freed_in_order;
  };
};
static_assert(sizeof(Slice) == 64, "a slice record fills one cache line");

// Note [One line per slice]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// With many live slices, every free and every reservation reads records that are not in any
// cache: the slice, its page neighbours, the free slices it merges with. A record that straddles
// two cache lines costs two misses where one would do. The links a slice uses in one state only
// share storage with those of the other states (free-bin links while free, the epoch chain while
// pending, the owning thread cache and the request while live or held), so a record is 64 bytes
// and, aligned, one line. Code reads those fields only for a slice known to be in their state.

// Note [Loads started early]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With a million live slices the records, their pages and the pointer index no longer fit any
// cache, and a free or a reservation is mostly waiting for memory: a free reads the index cell,
// then the slice it names, then that slice's page and, when the slice goes back to a sliced pool
// at once, its page neighbours to merge with; a reservation reads the free slice it carves, then
// the index cell of the new pointer. Each read waited for the one before, even where only its
// address did. So each path asks for the next lines as soon as their addresses are known: a free
// for the index cell before it takes the shard's lock, and for the page and both neighbours
// together once the slice is found (wasted where the slice waits for a fence, and read later);
// a reservation for the new pointer's cell while it carves. The reads then overlap each other
// and the work in between.

// Counted: whether a page holds one slice or more is asked on every carve and free, and without
// the count the answer read the page's first slice, a cache miss of its own with many live.
using PageSlices =
    bi::list<Slice, bi::member_hook<Slice, bi::list_member_hook<FastLink>, &Slice::page_hook>,
             bi::constant_time_size<true>>;

// Starts loading what freeing `slice` reads or writes after its record: its page and the records
// of its page neighbours, to be merged with or marked (Note [Loads started early]).
inline void prefetch_free_neighbourhood(const Slice& slice) {
  __builtin_prefetch(slice.page);
  const auto at = PageSlices::s_iterator_to(slice);
  __builtin_prefetch(std::next(at).pointed_node(), 1);
  __builtin_prefetch(std::prev(at).pointed_node(), 1);
}

// A pool's free slices, binned by size (Note [Free bins] in free_bins.h).
using FreeSet = FreeBins<Slice>;

// One device allocation. Its slices tile it exactly, in address order. What every free and
// carve reads (the pool, the busy count, the slice list) fills the first of its two cache lines,
// the one a prefetch of the page loads (Note [Loads started early]); the links of the page set
// and the idle list, read when the page is looked up by address or goes idle or busy, the second.
struct alignas(64) Page {
  Pool* pool = nullptr;
  std::uint64_t busy = 0;  // slices that are not free
  PageSlices slices;
  DevicePtr base = 0;
  std::uint64_t size = 0;
  std::uint64_t idle_since = 0;  // reservation clock when busy dropped to 0
  bi::set_member_hook<FastLink> addr_hook;   // the manager's page set
  bi::list_member_hook<FastLink> idle_hook;  // the pool's idle list (busy == 0)
  std::uint64_t idle_order = 0;  // the shard's count of pages gone idle, then: idle pages' order
  // Idle: its last slice came back from a stream-ordered free (Note [Idle memory before a park]
  // in memory_manager.cpp).
  bool idle_after_ordered_free = false;
};

struct PageOrder {
  bool operator()(const Page& a, const Page& b) const { return a.base < b.base; }
  bool operator()(const Page& a, DevicePtr p) const { return a.base < p; }
  bool operator()(DevicePtr p, const Page& a) const { return p < a.base; }
};
using PageSet =
    bi::set<Page, bi::member_hook<Page, bi::set_member_hook<FastLink>, &Page::addr_hook>,
            bi::compare<PageOrder>, bi::constant_time_size<true>>;
using IdleList =
    bi::list<Page, bi::member_hook<Page, bi::list_member_hook<FastLink>, &Page::idle_hook>,
             bi::constant_time_size<true>>;

inline constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

// A page a pool gave up, to be returned to the device once the manager's lock is released
// (Note [Outside the lock] in memory_manager.cpp).
struct PageRelease {
  DevicePtr base = 0;
  std::uint64_t size = 0;
};
using ReleaseList = boost::container::small_vector<PageRelease, 4>;

// Raises `peak` to `value` when it is below it, whatever other threads raise it to meanwhile.
inline void raise_to(std::atomic<std::uint64_t>& peak, std::uint64_t value) {
  std::uint64_t seen = peak.load(std::memory_order_relaxed);
  while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// The bytes of a device's pages, over every shard: each driver allocation a pool made, less each
// page a pool gave up (from then on the driver's to free; a page lent from one shard to another
// stays counted), and the most there ever were (Note [Device peaks] in manager_shards.cpp).
// Written at growths, releases and resets only.
struct DeviceReserved {
  std::atomic<std::uint64_t> now{0};
  std::atomic<std::uint64_t> peak{0};
  void add(std::uint64_t bytes) {
    raise_to(peak, now.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  }
  void remove(std::uint64_t bytes) { now.fetch_sub(bytes, std::memory_order_relaxed); }
};

// Idle bytes the held bound always allows beyond the most bytes in use, for each shard made
// (Note [Held memory bound] in memory_manager.cpp).
inline constexpr std::uint64_t kHeldSlack = 32 * MiB;

// State shared by all pools of one manager.
struct PoolContext {
  explicit PoolContext(Device& d) : device(d), alignment(d.alignment()) {}
  Device& device;
  std::uint64_t alignment;
  std::uint64_t total_memory = 0;     // the device's, as the driver reports it (0: unknown)
  // The held bound (ManagerOptions::hold_percent; 0: off) and the most bytes in use on the
  // device at a growth (Shards::held_peak; unset: this shard's peak only): the padding budget
  // stays within what the bound leaves above the peak (Note [Exclusive pages] in page_pools.cpp).
  std::uint32_t hold_percent = 0;
  const std::atomic<std::uint64_t>* device_peak_in_use = nullptr;
  NodeSlab<Slice> slices;
  NodeSlab<Page> pages;
  PageSet page_set;                   // every page of every pool, by address
  const SliceIndex* index = nullptr;  // the manager's pointer index, to prefetch from only
  ReleaseList* released = nullptr;    // where release_page() puts pages; set under the lock
  // Takes another shard's idle page of `min_size` to `max_size` bytes, without a device call,
  // for a new page; sets *base and *size (Note [Shards] in manager_shards.cpp).
  bool (*borrow_page)(void* owner, std::uint64_t min_size, std::uint64_t max_size,
                      DevicePtr* base, std::uint64_t* size) = nullptr;
  void* borrow_owner = nullptr;
  // Whether a new page may come from borrow_page, or only from it (then no device call: a
  // growth that another shard's idle page would serve adds nothing to the device's bytes).
  enum class Borrow : std::uint8_t { first, only, never };
  Borrow borrow = Borrow::first;
  // The most bytes the next growth may take from the device as the held bound and the budget
  // leave room (set around a growth): a pool that would take a wider page than its request
  // needs stays within it (Note [Wider pages] in sliced_pool.cpp).
  std::uint64_t growth_room = Device::kNoGrowthLimit;
  // The shards the manager has made (Note [Shards]): budgets meant for the device are split
  // between them. Unset: one.
  const std::atomic<std::uint32_t>* shards_made = nullptr;
  DeviceReserved* device_reserved = nullptr;  // the manager's, over its shards (unset: none)
  std::uint32_t shares() const {
    return shards_made == nullptr ? 1 : shards_made->load(std::memory_order_relaxed);
  }
  std::uint64_t clock = 0;            // reservations so far (the dealloc-period clock)
  std::uint64_t idle_page_bytes = 0;  // whole idle pages in every pool
  std::uint64_t pages_gone_idle = 0;  // Page::idle_order of the next page to go idle
  std::uint64_t next_deadline = kNever;  // earliest clock at which an idle page expires
  // Bytes in use and reserved across every pool, with their high-water marks: the manager-wide
  // peaks an operator compares (peak reserved / peak in use is the pools' overhead), and the
  // live slices by size.
  struct Totals {
    std::uint64_t in_use = 0;
    std::uint64_t padding = 0;
    std::uint64_t in_use_peak = 0;
    std::uint64_t reserved = 0;
    std::uint64_t reserved_peak = 0;
    SizeHistogram live_sizes;
  } totals;
};

class Pool {
 public:
  Pool(PoolContext& ctx, std::optional<std::uint64_t> dealloc_period);
  virtual ~Pool();  // drops pages without any device call (forget, layout swap after cleanup)
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  virtual bool accepts(std::uint64_t size) const = 0;
  virtual const char* kind_name() const = 0;  // "sliced", "exclusive", ... (a literal)
  // Serves `size` from free memory without any device call; nullptr when it cannot.
  virtual Slice* try_reserve(std::uint64_t size) = 0;
  // As try_reserve(), for a request whose growth the held bound would have to make room for:
  // a pool that turns down free pages too wide for `size` may take one of them then (Note [Wide
  // reuse at the held bound] in memory_manager.cpp). nullptr when it does not.
  virtual Slice* try_reserve_at_bound(std::uint64_t) { return nullptr; }
  // Whether the pool holds a free page wider than try_reserve() takes for `size` (cheap: asked
  // before the held bound is weighed).
  virtual bool has_wider_free(std::uint64_t) const { return false; }
  // With PoolContext::Borrow::only: another shard's idle page as wide as try_reserve_at_bound()
  // takes, for `size`. out_of_memory when there is none, or the pool takes none so wide.
  virtual AllocStatus borrow_at_bound(std::uint64_t, Slice**) {
    return AllocStatus::out_of_memory;
  }
  // Whether every page the pool grows is larger than `device_bytes` (a sliced pool's page), so
  // that no growth can succeed on such a device (Note [Pages larger than the device]).
  virtual bool pages_larger_than(std::uint64_t) const { return false; }
  // Why growing for `size` is not allowed (a cap), or none. No device call.
  virtual Error growth_limit(std::uint64_t size) const;
  // Whether a growth keeps the pool's reserved bytes under a bound (a direct pool's reclaim):
  // every slice thread caches park from it counts then (Note [Thread caches]).
  virtual bool has_reclaim_bound() const { return false; }
  // Allocates a page from the device and serves `size` from it.
  virtual AllocStatus grow(std::uint64_t size, Slice** out) = 0;
  virtual PoolReport describe() const = 0;  // kind, shape, notes; counters filled by report()
  virtual std::size_t free_slices() const = 0;  // size of the free set (consistency checks)
  // FreeBins::consistent(), and what else the pool counts of its free memory (consistency checks)
  virtual bool free_set_consistent() const = 0;
  bool slices_coalesce() const { return coalesces_; }

  // Counter transitions driven by the manager's free path.
  void to_pending(Slice* slice);  // live or held -> pending
  void to_held(Slice* slice);     // live -> held
  void reissue(Slice* slice, std::uint64_t requested);  // held -> live (same address)
  void give_back(Slice* slice);   // pending -> free (coalescing, idle tracking)

  // Releases idle pages: all of them when `explicit_cleanup`, else those idle for at least the
  // dealloc period. Returns bytes released.
  std::uint64_t cleanup(bool explicit_cleanup);
  // An explicit cleanup that keeps the pages idle_after_ordered_free, newest first, as long as
  // they fit in *keep_bytes (which shrinks by each page kept).
  std::uint64_t cleanup_but_ordered_frees(std::uint64_t* keep_bytes);
  // Releases idle pages idle for at least `min_age` reservations, oldest first, until at most
  // `keep_bytes` of idle pages are left. Returns bytes released.
  std::uint64_t release_idle_pages(std::uint64_t min_age, std::uint64_t keep_bytes);
  // The idle page that went idle first (idle pages are listed in that order), of at least
  // `min_size` bytes; nullptr when there is none.
  Page* oldest_idle(std::uint64_t min_size = 0);
  // The smallest idle page of at least `min_size` bytes; nullptr when there is none.
  Page* smallest_idle(std::uint64_t min_size);
  // Appends every idle page of the pool to *out.
  void append_idle(std::vector<Page*>* out);
  // The bytes a growth for a request of `size` takes from the device: a page of the pool's.
  virtual std::uint64_t growth_bytes(std::uint64_t size) const {
    return align_up(size, alignment());
  }
  // Releases one of this pool's idle pages; returns its size.
  std::uint64_t release_idle(Page* page);
  // An idle page of `min_size` to `max_size` bytes leaves the pool without a device call, for
  // another shard of the manager to take (PoolContext::borrow_page); false when there is none.
  bool hand_over_idle(std::uint64_t min_size, std::uint64_t max_size, DevicePtr* base,
                      std::uint64_t* size);
  // Clock value at which this pool's oldest idle page expires, or kNever.
  std::uint64_t deadline() const;

  // A request passed this full capped pool and a later pool served it (spill), or its cap was
  // the answer (refusal).
  void note_spill() { ++capacity_spills_; }
  void note_refusal() { ++capacity_refusals_; }

  MemoryUsage usage() const { return usage_; }
  std::uint64_t pending_bytes() const { return pending_bytes_; }
  // Free bytes in every page, whole idle pages included.
  std::uint64_t free_bytes() const {
    return usage_.bytes_reserved - usage_.bytes_in_use - usage_.bytes_padding - pending_bytes_;
  }
  // Bytes of whole idle pages: what a release would give back to the device.
  std::uint64_t idle_page_bytes() const { return idle_page_bytes_; }
  std::uint64_t pages() const { return pages_; }
  PoolReport report() const;
  std::uint64_t alignment() const { return ctx_.alignment; }

 protected:
  // Whether a narrower page is tried when a page is refused: the refusal of a page wider than
  // the request needs is then not the program's (Device::allocate_if_room).
  enum class Fallback { none, narrower };
  // Allocates and registers a page holding one free slice that covers it. The slice is not in
  // any free set yet. Another shard's idle page of `min_size` (default: `size`) to `max_size`
  // bytes (at least `size`) may serve instead of the device.
  AllocStatus new_page(std::uint64_t size, Page** out, std::uint64_t max_size = 0,
                       std::uint64_t min_size = 0, Fallback fallback = Fallback::none);
  // Hands `slice` (already out of every free set) to the program.
  void mark_live(Slice* slice, std::uint64_t requested);

  // The concrete pool's free structure.
  virtual void on_free(Slice* slice) = 0;           // a slice became free: insert/coalesce
  virtual void on_release(Page* page) = 0;          // an idle page is about to be released
  virtual std::uint64_t largest_free() const = 0;

  // Before a growth: pages idle for a while go back while idle pages are many (Note [Growing
  // past idle pages] in pool.cpp).
  void release_stale_before_growth();
  void release_page(Page* page);
  void drop_page(Page* page);  // release_page() without the release: the page's nodes go
  // A page enters or leaves the idle list (busy dropped to 0 / a slice went live).
  void make_idle(Page* page);
  void make_busy(Page* page);

  PoolContext& ctx_;
  bool coalesces_ = false;  // sliced pools: no two free neighbours
  std::optional<std::uint64_t> dealloc_period_;
  IdleList idle_;
  std::uint64_t idle_page_bytes_ = 0;
  MemoryUsage usage_;
  std::uint64_t pending_bytes_ = 0;
  std::uint64_t pages_ = 0;
  std::uint64_t pages_peak_ = 0;
  std::uint64_t bytes_peak_ = 0;
  std::uint64_t reservations_ = 0;
  std::uint64_t device_allocs_ = 0;
  std::uint64_t device_releases_ = 0;
  std::uint64_t stale_releases_ = 0;  // pages release_idle_pages() gave back
  std::uint64_t pages_borrowed_ = 0;  // pages taken from other shards instead of the device
  std::uint64_t pages_lent_ = 0;      // idle pages handed to other shards
  std::uint64_t capacity_spills_ = 0;    // requests served by a later pool while this one was full
  std::uint64_t capacity_refusals_ = 0;  // requests refused because this one was full
};

}  // namespace poolcuda
