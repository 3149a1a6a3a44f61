// A memcpy into memory that may vanish under the process: a shared mapping of a client's POSIX
// shared-memory object, which the client can truncate (ftruncate) at any time. A CPU write to a
// page past the object's new end raises SIGBUS, whose default action kills the server; inside
// GuardedCopy that SIGBUS ends the copy instead and GuardedCopy returns false.
//
// How: a process-wide SIGBUS handler (installed on first use, keeping the handler it replaced)
// and, for the duration of one GuardedCopy, a per-thread record of the guarded address range and
// a sigsetjmp point. A SIGBUS on that thread at an address inside that range siglongjmps back to
// GuardedCopy (memcpy holds no lock, so leaving it half way is safe). Any other SIGBUS (another
// thread, another address, no copy in progress) goes to the replaced handler or, when that was
// the default, gets the default action back: the process dies with the fault, as without the
// guard. Other signals are untouched.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dequantd::regions {

// Copies `bytes` bytes from `src` to `dst`. [guard_begin, guard_begin + guard_bytes) is the
// memory that may vanish (it must contain [dst, dst + bytes)); a SIGBUS at an address inside it
// ends the copy and returns false (the bytes copied so far are unspecified). Returns true when
// every byte was copied. Thread-safe; async-signal-safe it is not (call it from ordinary code).
bool GuardedCopy(uint8_t* dst, const uint8_t* src, size_t bytes, const uint8_t* guard_begin,
                 size_t guard_bytes);

}  // namespace dequantd::regions
