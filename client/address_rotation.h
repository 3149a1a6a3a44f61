// Spreading dequantctl's calls over a static list of replicas (docs/container.md, "Scale-out").
//
// gRPC's round_robin connects to every address of a channel; a new channel's first call goes to
// whichever address is READY first (for "ipv4:A,B,C" nearly always A), later calls to any READY
// one. One-shot processes (dequantctl in a script, one call each) gave 10, 1 and 1 of 12 calls
// over three local replicas, and the 6 channels of `dequantize-layers --streams 6` 3, 3 and 0.
// Rotating the list alone was not enough: once all three were READY the calls still landed at
// random (30 one-shot processes: 8/11/11, 13/10/7, 8/9/13; --streams 6: 5/1/0 once in three).
// So for --lb round_robin with an ipv4:/ipv6: list dequantctl gives each channel one address:
// pick_first over the list rotated to start one place further than the previous dequantctl
// process of this user on this host (a counter in a POSIX shared-memory object), each extra
// --streams channel one place further again; the other addresses stay its fallback. Where the
// counter cannot be used the process starts at a random place. A random start for every process
// would spread calls only on average: for 30 one-shot calls over three replicas, 3.7% of runs
// would leave one replica with fewer than 5.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace dequantd {

// The number of addresses of an "ipv4:" or "ipv6:" target (comma-separated, as gRPC's
// sockaddr resolver reads them); 1 for any other target (HOST:PORT, dns:, unix:).
int AddressCount(absl::string_view target);

// `target` with its address list rotated left by `by` places (mod AddressCount):
// RotateAddressList("ipv4:A:1,B:1,C:1", 1) == "ipv4:B:1,C:1,A:1". Any target that is not a list
// of several addresses is returned as it is.
std::string RotateAddressList(absl::string_view target, uint64_t by);

// The place this process starts at: the value of the counter in the shared-memory object `key`
// ("/NAME", as shm_open), which this call increments (under an flock, so concurrent processes
// get distinct values). The object is created (mode 0600) when missing; one that is not a regular
// file of this user, or has group or other permissions, is not used. Where it cannot be used: a
// random number. Never fails.
uint64_t NextProcessRotation(const std::string& key);

// dequantctl's counter for `command` (e.g. "dequantize") over `target`:
// "/dequantctl-rotation.<uid>.<FNV-1a 64 of target and command, 16 hex digits>" (a name unlike
// the "/dequantctl.<pid>.<region>" objects of --shm, client/shm_client.h). One counter per
// address list and command, so that a script alternating two commands (a cheap `info`, then a
// heavy `dequantize`) over an even number of replicas still spreads each command's calls: with
// one counter per user every second call, and so every heavy one, landed on the same replica.
std::string RotationKey(absl::string_view target, absl::string_view command);

}  // namespace dequantd
