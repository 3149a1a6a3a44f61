// `dequantctl regions` (see commands.h).
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/shm_client.h"
#include "client/table.h"

namespace dequantd {

absl::Status RunRegions(DequantClient& client, std::ostream& out) {
  RegionClient regions(client.channel(), client.options());
  absl::StatusOr<v1::SharedMemoryStatusResponse> status = regions.Status();
  if (!status.ok()) return status.status();
  Table table(
      {"name", "kind", "key", "device", "offset", "bytes", "pinned", "calls", "idle s", "owner"},
      {false, false, false, true, true, true, false, true, true, false});
  int64_t total_bytes = 0;
  for (const v1::SharedMemoryRegionInfo& r : status->regions()) {
    const bool host = r.kind() == "host";
    table.AddRow({r.name(), r.kind(), host ? r.key() : "-",
                  host ? "-" : absl::StrCat(r.device_id()), absl::StrCat(r.offset()),
                  absl::StrCat(r.byte_size()), host ? (r.pinned() ? "yes" : "no") : "-",
                  absl::StrCat(r.calls_in_flight()), Fixed(r.idle_seconds(), 1), r.owner()});
    total_bytes += r.byte_size();
  }
  table.Print(out);
  out << Count(status->regions_size(), "region") << ", " << total_bytes << " of "
      << status->max_bytes() << " bytes (at most " << Count(status->max_regions(), "region")
      << "); --shared-memory=" << status->mode() << ", idle regions released "
      << (status->idle_release_seconds() > 0
              ? absl::StrCat("after ", Fixed(status->idle_release_seconds(), 0), " s")
              : std::string("never"))
      << '\n';
  return absl::OkStatus();
}

}  // namespace dequantd
