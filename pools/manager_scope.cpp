// The manager's lock scope and the work done at its end (Note [Outside the lock] in
// memory_manager.cpp): pages handed back to the device just before the lock is released, log
// lines written once it is, so that a slow stderr never stalls another thread's allocation.
// Depends on manager_impl.h only.
#include <cinttypes>
#include <cstdio>

#include "pools/manager_shards.h"

namespace poolcuda {

MemoryManager::Impl::Scope::Scope(Impl& m) : m_(m) { relock(); }

MemoryManager::Impl::Scope::~Scope() {
  if (locked_) unlock();
}

void MemoryManager::Impl::Scope::attach() {
  m_.outbox = &box_;
  m_.ctx.released = &box_.releases;
}

void MemoryManager::Impl::Scope::detach() {
  m_.outbox = nullptr;
  m_.ctx.released = nullptr;
}

void MemoryManager::Impl::Scope::relock() {
  m_.mutex.lock();
  locked_ = true;
  attach();
}

void MemoryManager::Impl::Scope::unlock() {
  detach();
  // Still under the lock: a page given up must reach the device before any later forget()
  // (a device reset), or it could be freed after the reset, when its address may already be a
  // new page of these same pools. Device::release never blocks (Note [Outside the lock]).
  for (const PageRelease& page : box_.releases) m_.device.release(page.base, page.size);
  if (!box_.releases.empty())
    m_.pages_handed.fetch_add(box_.releases.size(), std::memory_order_release);
  box_.releases.clear();
  if (m_.shards != nullptr && m_.shards->count() > 1) m_.publish_figures();
  locked_ = false;
  m_.mutex.unlock();
  if (!box_.logs.empty()) {
    m_.write_logs(box_.logs);
    box_.logs.clear();
  }
}

void MemoryManager::Impl::publish_figures() {
  // For the other shards (Note [Shards]): stores to lines of this shard's own, only on change.
  // Scopes publish only once there are others (a shard made later finds this one's figures at
  // its first need: this shard publishes at every unlock from then on).
  // A growth the route did not publish at once: the device's reserved bytes may peak here.
  if (ctx.totals.reserved > reserved_published.load(std::memory_order_relaxed))
    sample_device_peaks();
  const std::uint64_t lendable = ctx.idle_page_bytes - persistent->idle_page_bytes();
  if (idle_published.load(std::memory_order_relaxed) != lendable)
    idle_published.store(lendable, std::memory_order_relaxed);
  const std::uint64_t unused = ctx.totals.reserved - ctx.totals.in_use - ctx.totals.padding;
  if (unused_published.load(std::memory_order_relaxed) != unused)
    unused_published.store(unused, std::memory_order_relaxed);
  if (reserved_published.load(std::memory_order_relaxed) != ctx.totals.reserved)
    reserved_published.store(ctx.totals.reserved, std::memory_order_relaxed);
  // Frees too: a shard its threads left must not show the plan bytes it no longer has in use.
  if (in_use_published.load(std::memory_order_relaxed) != ctx.totals.in_use)
    in_use_published.store(ctx.totals.in_use, std::memory_order_relaxed);
}

void MemoryManager::Impl::sample_device_peaks() {
  peaks_sampled_in_use = ctx.totals.in_use;
  if (shards == nullptr || shards->count() < 2) return;
  shards->note_device_peaks(shard_index, ctx.totals.in_use);
}

namespace {

std::string hex(DevicePtr ptr) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "0x%" PRIx64, ptr);
  return buffer;
}

}  // namespace

void MemoryManager::Impl::write_logs(boost::container::small_vector<LogEvent, 2>& logs) {
  for (LogEvent& event : logs) {
    std::string line;
    switch (event.kind) {
      case LogEvent::Kind::text:
        line = std::move(event.text);
        break;
      case LogEvent::Kind::allocate:
        line = "allocate " + std::to_string(event.size) + " B -> " + hex(event.ptr) + " (" +
               event.pool + ")";
        break;
      case LogEvent::Kind::free:
        line = "free " + hex(event.ptr);
        break;
    }
    if (options.log_sink) {
      options.log_sink(event.level, line);
    } else {
      std::fprintf(stderr, "poolcuda: %s\n", line.c_str());
    }
  }
}

void MemoryManager::Impl::log(LogLevel level, std::string message) {
  if (options.log == LogLevel::off || level > options.log || outbox == nullptr) return;
  LogEvent event;
  event.level = level;
  event.text = std::move(message);
  outbox->logs.push_back(std::move(event));
}

void MemoryManager::Impl::trace(LogEvent::Kind kind, std::uint64_t size, DevicePtr ptr,
                                const Pool* pool) {
  if (options.log != LogLevel::full || outbox == nullptr) return;
  LogEvent event;
  event.level = LogLevel::full;
  event.kind = kind;
  event.size = size;
  event.ptr = ptr;
  event.pool = pool != nullptr ? pool->kind_name() : "";
  outbox->logs.push_back(std::move(event));
}

}  // namespace poolcuda
