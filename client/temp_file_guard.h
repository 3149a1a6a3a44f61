// Removing dequantctl's temporary output files when it is killed by SIGINT, SIGTERM, SIGHUP (a
// closed terminal or ssh session) or SIGPIPE (a closed stdout pipe).
//
// An OutputFile streams into "<path>.tmp.XXXXXX" (formats/atomic_file.h) and renames it on a
// successful Finish (a path that is not a regular file, e.g. /dev/null, is written in place and
// has no temporary file to register); the destructor removes it on every other path, but a signal's
// default action runs no destructor. So each temporary path is registered here while its file is
// open, and the handler installed by InstallTempFileSignalHandlers() unlinks every registered path,
// restores the default action and re-raises the signal: the process still ends with that signal's
// status.
//
// Async-signal-safety: paths live in a fixed static table (kMaxTempFiles slots of
// kMaxTempPathBytes bytes, no allocation); a slot's bytes are written before an atomic flag
// publishes it, and the handler reads only published slots and calls only unlink(2), signal(2)
// and raise(3). Registration and deferral are thread-safe; the handler may run on any thread.
#pragma once

#include <cstddef>
#include <string>

namespace dequantd {

inline constexpr int kMaxTempFiles = 8;            // paths registered at once
inline constexpr size_t kMaxTempPathBytes = 4096;  // including the terminating NUL

// Installs the handler for SIGINT, SIGTERM, SIGHUP and SIGPIPE (sigaction, SA_RESTART), except
// for a signal that is ignored (SIG_IGN) when it is called: that one stays ignored (nohup).
// Idempotent; dequantctl's main calls it first. Without it, registered paths are only
// bookkeeping.
void InstallTempFileSignalHandlers();

// Registers one temporary path for removal on those signals while the guard lives. A path that
// does not fit (longer than kMaxTempPathBytes - 1, or all slots taken) is not registered and
// registered() is false: the file still works, it is just not removed on a signal. Move-only.
class TempFileGuard {
 public:
  TempFileGuard() = default;  // registers nothing
  explicit TempFileGuard(const std::string& path);
  ~TempFileGuard();  // unregisters (does not remove the file)
  TempFileGuard(TempFileGuard&& other) noexcept;
  TempFileGuard& operator=(TempFileGuard&& other) noexcept;
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;

  bool registered() const { return slot_ >= 0; }

 private:
  void Release();
  int slot_ = -1;
};

// While any of these lives (on any thread), those signals are held back: the handler only
// records the signal, and the last deferral to end removes the registered paths and re-raises
// it. For short steps whose temporary file cannot be registered (safetensors::WriteFile names
// its own) and for the gap between creating a temporary file and registering it. Not movable.
class ScopedSignalDeferral {
 public:
  ScopedSignalDeferral();
  ~ScopedSignalDeferral();
  ScopedSignalDeferral(const ScopedSignalDeferral&) = delete;
  ScopedSignalDeferral& operator=(const ScopedSignalDeferral&) = delete;
};

}  // namespace dequantd
