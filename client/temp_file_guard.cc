// The static table of temporary paths and the SIGINT/SIGTERM/SIGHUP/SIGPIPE handler (see
// temp_file_guard.h).
#include "client/temp_file_guard.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>

namespace dequantd {
namespace {

static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

// The signals whose default action ends the process and that dequantctl can be sent while it
// writes: Ctrl-C, kill, a closed terminal or ssh session, a closed stdout pipe.
constexpr int kTerminatingSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

struct Slot {
  std::atomic<bool> claimed{false};    // owned by a TempFileGuard
  std::atomic<bool> published{false};  // `path` is complete and may be read by the handler
  char path[kMaxTempPathBytes];
};

Slot g_slots[kMaxTempFiles];
std::atomic<int> g_defer_depth{0};     // live ScopedSignalDeferral objects
std::atomic<int> g_pending_signal{0};  // a signal held back by a deferral, or 0

// Async-signal-safe: unlink(2) on every published path.
void RemoveRegisteredFiles() {
  for (Slot& slot : g_slots) {
    if (slot.published.load(std::memory_order_acquire)) ::unlink(slot.path);
  }
}

// Removes the files and ends the process with `sig` (the default action of each of them).
void RemoveFilesAndDie(int sig) {
  RemoveRegisteredFiles();
  std::signal(sig, SIG_DFL);
  std::raise(sig);  // inside the handler: delivered when it returns
}

extern "C" void OnTerminatingSignal(int sig) {
  const int saved_errno = errno;
  if (g_defer_depth.load(std::memory_order_acquire) > 0) {
    g_pending_signal.store(sig, std::memory_order_release);
    // The last deferral may have ended between the load and the store: then act here, unless
    // it already took the signal.
    if (g_defer_depth.load(std::memory_order_acquire) > 0 ||
        g_pending_signal.exchange(0, std::memory_order_acq_rel) == 0) {
      errno = saved_errno;
      return;
    }
  }
  RemoveFilesAndDie(sig);
}

}  // namespace

void InstallTempFileSignalHandlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnTerminatingSignal;
  sigemptyset(&action.sa_mask);
  for (int sig : kTerminatingSignals) sigaddset(&action.sa_mask, sig);
  action.sa_flags = SA_RESTART;  // a deferred signal must not fail the write it interrupted
  for (int sig : kTerminatingSignals) {
    struct sigaction previous;
    // An inherited SIG_IGN stays (nohup's SIGHUP, a background job's SIGINT).
    if (::sigaction(sig, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &action, nullptr);
  }
}

TempFileGuard::TempFileGuard(const std::string& path) {
  if (path.size() >= kMaxTempPathBytes) return;
  for (int i = 0; i < kMaxTempFiles; ++i) {
    bool expected = false;
    if (!g_slots[i].claimed.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      continue;
    }
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].published.store(true, std::memory_order_release);
    slot_ = i;
    return;
  }
}

TempFileGuard::~TempFileGuard() { Release(); }

TempFileGuard::TempFileGuard(TempFileGuard&& other) noexcept
    : slot_(std::exchange(other.slot_, -1)) {}

TempFileGuard& TempFileGuard::operator=(TempFileGuard&& other) noexcept {
  if (this != &other) {
    Release();
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

void TempFileGuard::Release() {
  if (slot_ < 0) return;
  g_slots[slot_].published.store(false, std::memory_order_release);
  g_slots[slot_].claimed.store(false, std::memory_order_release);
  slot_ = -1;
}

ScopedSignalDeferral::ScopedSignalDeferral() {
  g_defer_depth.fetch_add(1, std::memory_order_acq_rel);
}

ScopedSignalDeferral::~ScopedSignalDeferral() {
  if (g_defer_depth.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  const int sig = g_pending_signal.exchange(0, std::memory_order_acq_rel);
  if (sig != 0) RemoveFilesAndDie(sig);
}

}  // namespace dequantd
