// GuardedCopy (see guarded_copy.h).
#include "server/regions/guarded_copy.h"

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

namespace dequantd::regions {
namespace {

// The copy in progress on this thread: the guarded range and where to jump on a SIGBUS in it.
struct Guard {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  sigjmp_buf resume;
};

// Initial-exec TLS: the handler reads it without any allocation or lock.
__attribute__((tls_model("initial-exec"))) thread_local Guard* volatile t_guard = nullptr;

struct sigaction g_replaced {};  // the SIGBUS disposition before ours; written once

void OnSigbus(int signal, siginfo_t* info, void* context) {
  Guard* guard = t_guard;
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  if (guard != nullptr && address >= guard->begin && address < guard->end) {
    siglongjmp(guard->resume, 1);
  }
  // Not a guarded copy's fault: what would have happened without us.
  if ((g_replaced.sa_flags & SA_SIGINFO) != 0 && g_replaced.sa_sigaction != nullptr) {
    g_replaced.sa_sigaction(signal, info, context);
    return;
  }
  if (g_replaced.sa_handler != SIG_DFL && g_replaced.sa_handler != SIG_IGN) {
    g_replaced.sa_handler(signal);
    return;
  }
  // The default action: restored, and the faulting instruction runs again on return (a fault
  // raised by kill() does not recur; re-raise it).
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(SIGBUS, &fallback, nullptr);
  if (info->si_code <= 0) raise(SIGBUS);
}

void InstallHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &g_replaced);
  });
}

}  // namespace

bool GuardedCopy(uint8_t* dst, const uint8_t* src, size_t bytes, const uint8_t* guard_begin,
                 size_t guard_bytes) {
  InstallHandler();
  Guard guard;
  guard.begin = reinterpret_cast<uintptr_t>(guard_begin);
  guard.end = guard.begin + guard_bytes;
  // savemask = 1: the jump restores the signal mask (SIGBUS is blocked inside the handler).
  if (sigsetjmp(guard.resume, 1) != 0) {
    t_guard = nullptr;
    return false;
  }
  t_guard = &guard;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return true;
}

}  // namespace dequantd::regions
