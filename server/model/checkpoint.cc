// The checkpoint store: reads config.json, parses the safetensors shard headers, validates every
// AWQ layer and reads its tensors into owned memory (see checkpoint.h for the policy).
#include "server/model/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "formats/quant_config.h"
#include "formats/quant_tensors.h"
#include "kernels/format_registry.h"
#include "nlohmann/json.hpp"

namespace dequantd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kConfigFile[] = "config.json";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";

bool IsRegularFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// FAILED_PRECONDITION for layer `prefix` (of `row`'s format) lacking required role `missing`,
// found through `present`, a tensor of the layer in `file` (its anchor, or a tensor named like
// another role when the anchor is the one missing): "<file>: tensor '<present>' (layer
// '<prefix>', format <f>): the layer has no <role> tensor: '<prefix><sep><role>' is missing".
absl::Status MissingRole(const FormatRow& row, const std::string& prefix,
                         const std::string& present, const std::string& file, int missing) {
  const std::string role(row.roles[static_cast<size_t>(missing)]);
  return absl::FailedPreconditionError(
      absl::StrCat(file, ": tensor '", present, "' (layer '", prefix, "', format ",
                   std::string(row.name), "): the layer has no ", role, " tensor: '", prefix,
                   std::string(row.role_separator), role, "' is missing"));
}

// The shard file names of `dir`, and (from the index, if any) which shard each tensor is in.
struct ShardList {
  std::vector<std::string> files;                 // names relative to dir, sorted, unique
  std::map<std::string, std::string> weight_map;  // tensor -> file (empty without an index)
};

absl::StatusOr<ShardList> ListShards(const fs::path& dir) {
  ShardList out;
  const fs::path index = dir / kIndexFile;
  if (IsRegularFile(index)) {
    absl::StatusOr<json> j = formats::ReadJsonObject(index);
    if (!j.ok()) return j.status();
    const auto map_it = j->find("weight_map");
    if (map_it == j->end() || !map_it->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index.string(), ": no 'weight_map' object"));
    }
    std::set<std::string> files;
    for (const auto& [tensor, file] : map_it->items()) {
      if (!file.is_string() || file.get<std::string>().empty() ||
          absl::StrContains(file.get<std::string>(), "/")) {
        return absl::InvalidArgumentError(absl::StrCat(index.string(), ": weight_map entry for '",
                                                       tensor, "' is not a plain file name"));
      }
      files.insert(file.get<std::string>());
      out.weight_map[tensor] = file.get<std::string>();
    }
    out.files.assign(files.begin(), files.end());
  } else if (IsRegularFile(dir / kSingleFile)) {
    out.files.push_back(kSingleFile);
  } else {
    std::error_code ec;
    std::string not_regular;  // a *.safetensors that is a FIFO, directory, ...: named if alone
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() != ".safetensors") continue;
      if (IsRegularFile(e.path())) {
        out.files.push_back(e.path().filename().string());
      } else if (not_regular.empty()) {
        not_regular = e.path().filename().string();
      }
    }
    if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("list ", dir.string()));
    std::sort(out.files.begin(), out.files.end());
    if (out.files.empty() && !not_regular.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(dir.string(), ": no *.safetensors files; ",
                                                        not_regular, " is not a regular file"));
    }
  }
  if (out.files.empty()) {
    return absl::NotFoundError(absl::StrCat(dir.string(), ": no *.safetensors files"));
  }
  return out;
}

// Alignment of each tensor copy (a cache line; the fast CPU path needs 4).
constexpr size_t kCopyAlignment = 64;

int64_t RoundUpToAlignment(int64_t bytes) {
  constexpr int64_t a = static_cast<int64_t>(kCopyAlignment);
  return (bytes + a - 1) / a * a;
}

// An open shard: its header, parsed through a memory map (only the header's pages are read that
// way, and the map is dropped once Open returns), and a descriptor the tensor bytes are pread
// from into owned memory.
struct Shard {
  std::unique_ptr<safetensors::MappedFile> map;
  int fd = -1;
  int index = -1;  // in Checkpoint::shards()
  Shard() = default;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `path` for pread, then parses its header. ABORTED if the path names another file by the
// time the header is parsed (replaced in the meantime), so header and bytes always agree.
absl::StatusOr<std::unique_ptr<Shard>> OpenShard(const fs::path& path) {
  auto shard = std::make_unique<Shard>();
  shard->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (shard->fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path.string()));
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> map =
      safetensors::MappedFile::Open(path.string());
  if (!map.ok()) return map.status();
  shard->map = *std::move(map);
  struct stat by_fd, by_path;
  if (::fstat(shard->fd, &by_fd) != 0 || ::stat(path.c_str(), &by_path) != 0 ||
      by_fd.st_dev != by_path.st_dev || by_fd.st_ino != by_path.st_ino) {
    return absl::AbortedError(
        absl::StrCat("shard '", path.string(), "' was replaced while being opened; try again"));
  }
  return shard;
}

// Where a tensor lives.
struct TensorRef {
  const Shard* shard = nullptr;
  const safetensors::TensorEntry* entry = nullptr;
  const std::string& path() const { return shard->map->path(); }
  int64_t bytes() const { return entry->data_end - entry->data_begin; }
  int64_t file_offset() const { return shard->map->header().data_start + entry->data_begin; }
};

// Issue 10: every tensor of `tensors` that is not a stored tensor of a layer (a name in
// `stored_names`), as RawTensor index entries sorted by name. Errors: the errno of fstat.
absl::StatusOr<std::vector<RawTensor>> IndexRawTensors(
    const std::map<std::string, TensorRef>& tensors, const std::set<std::string>& stored_names) {
  std::vector<RawTensor> out;
  for (const auto& [name, ref] : tensors) {
    if (stored_names.count(name) != 0) continue;
    struct stat st;
    if (::fstat(ref.shard->fd, &st) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("stat ", ref.path()));
    }
    out.push_back(RawTensor{.name = name,
                            .dtype = ref.entry->dtype,
                            .shape = ref.entry->shape,
                            .file = ref.path(),
                            .file_offset = ref.file_offset(),
                            .bytes = ref.bytes(),
                            .device = st.st_dev,
                            .inode = st.st_ino,
                            .mtime_ns = ModificationTimeNs(st)});
  }
  return out;  // std::map iterates in name order
}

// Issue 10: the text of config.json. Errors: as formats::ReadJsonObject's.
absl::StatusOr<std::string> ReadConfigText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat(path.string(), ": cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

const RawTensor* Checkpoint::FindRawTensor(std::string_view name) const {
  const auto it =
      std::lower_bound(raw_tensors_.begin(), raw_tensors_.end(), name,
                       [](const RawTensor& t, std::string_view n) { return t.name < n; });
  return it != raw_tensors_.end() && it->name == name ? &*it : nullptr;
}

void Checkpoint::AlignedFree::operator()(uint8_t* p) const {
  ::operator delete[](p, std::align_val_t{kCopyAlignment});
}

Checkpoint::~Checkpoint() = default;

int DefaultLoadThreads() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
}

int64_t Checkpoint::ReleaseHostCopies(const std::vector<bool>& which) {
  int64_t freed = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (copies_[i] == nullptr || (!which.empty() && !which[i])) continue;
    freed += layers_[i].view.shape.packed_bytes();
    layers_[i].view.tensors.fill(nullptr);
    copies_[i].reset();
  }
  return freed;
}

std::string Checkpoint::StoredTensorName(int64_t layer, int role) const {
  const QuantizedLayer& l = layers_[static_cast<size_t>(layer)];
  const FormatRow& row = FormatRowOf(l.view.shape.format);
  return absl::StrCat(l.name, std::string(row.role_separator), std::string(row.roles[role]));
}

absl::StatusOr<int64_t> Checkpoint::ReadHostCopies(const std::vector<bool>& which, int threads,
                                                   const std::atomic<bool>* cancel) {
  constexpr int64_t kChunkBytes = int64_t{64} << 20;
  std::vector<std::unique_ptr<uint8_t[], AlignedFree>> copies(layers_.size());
  std::vector<std::array<uint8_t*, kMaxTensorRoles>> bases(layers_.size());
  std::vector<ReadChunk> chunks;
  int64_t total_bytes = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if ((!which.empty() && !which[i]) || copies_[i] != nullptr) continue;
    const QuantizedLayer& layer = layers_[i];
    const int roles = TensorRoleCount(layer.view.shape.format);
    int64_t total = 0;  // absent optional roles have no range (shard -1, 0 bytes)
    for (int r = 0; r < roles; ++r) total += RoundUpToAlignment(layer.stored[r].bytes);
    copies[i].reset(
        static_cast<uint8_t*>(::operator new[](static_cast<size_t>(std::max<int64_t>(total, 1)),
                                               std::align_val_t{kCopyAlignment}, std::nothrow)));
    if (copies[i] == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("layer '", layer.name, "': cannot allocate ", total, " bytes for its copy"));
    }
    int64_t at = 0;
    for (int r = 0; r < roles; ++r) {
      if (layer.stored[r].shard < 0) continue;  // an absent optional role: its pointer stays null
      bases[i][r] = copies[i].get() + at;
      at += RoundUpToAlignment(layer.stored[r].bytes);
      AppendChunks(layer.stored[r].shard, layer.stored[r].offset, layer.stored[r].bytes,
                   static_cast<int64_t>(i), r, kChunkBytes, &chunks);
      total_bytes += layer.stored[r].bytes;
    }
  }
  if (chunks.empty()) return 0;
  absl::StatusOr<ShardReader> reader = ShardReader::Open(shards_);
  if (!reader.ok()) return reader.status();
  const absl::Status read = reader->Read(
      chunks, threads > 0 ? threads : DefaultLoadThreads(),
      [this](int64_t layer, int role) { return StoredTensorName(layer, role); },
      [&](int, const ReadChunk& c) -> absl::StatusOr<uint8_t*> {
        return bases[static_cast<size_t>(c.layer)][c.role] + c.tensor_offset;
      },
      [](int, const ReadChunk&, uint8_t*) { return absl::OkStatus(); }, cancel);
  if (!read.ok()) return read;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (copies[i] == nullptr) continue;
    for (int r = 0; r < TensorRoleCount(layers_[i].view.shape.format); ++r)
      layers_[i].view.tensors[r] = bases[i][r];
    copies_[i] = std::move(copies[i]);
  }
  return total_bytes;
}

const QuantizedLayer* Checkpoint::Find(std::string_view name) const {
  const auto it =
      std::lower_bound(layers_.begin(), layers_.end(), name,
                       [](const QuantizedLayer& l, std::string_view n) { return l.name < n; });
  return it != layers_.end() && it->name == name ? &*it : nullptr;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir,
                                                             const CheckpointLoad& load) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory '", dir, "' not found"));
  }
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint '", dir, "' is not a directory"));
  }
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  const fs::path root(dir);

  absl::StatusOr<QuantizationConfig> config = formats::ParseQuantizationConfig(root / kConfigFile);
  if (!config.ok()) return config.status();
  ckpt->config_ = *std::move(config);

  absl::StatusOr<ShardList> shards = ListShards(root);
  if (!shards.ok()) return shards.status();

  // Open every shard; index every tensor by name. The shards are closed when Open returns.
  std::vector<std::unique_ptr<Shard>> open_shards;
  std::map<std::string, TensorRef> tensors;
  std::map<std::string, const Shard*> by_file;
  for (const std::string& name : shards->files) {
    const fs::path path = root / name;
    if (!IsRegularFile(path)) {
      return absl::NotFoundError(absl::StrCat(
          "shard '", path.string(), "' not found",
          shards->weight_map.empty() ? "" : absl::StrCat(" (named in ", kIndexFile, ")")));
    }
    absl::StatusOr<std::unique_ptr<Shard>> shard = OpenShard(path);
    if (!shard.ok()) return shard.status();
    Shard* f = shard->get();
    struct stat st;
    if (::fstat(f->fd, &st) != 0)
      return absl::ErrnoToStatus(errno, absl::StrCat("stat ", path.string()));
    f->index = static_cast<int>(ckpt->shards_.size());
    ckpt->shards_.push_back(ShardFile{.path = path.string(),
                                      .device = st.st_dev,
                                      .inode = st.st_ino,
                                      .size = static_cast<int64_t>(st.st_size)});
    by_file[name] = f;
    for (const auto& [tensor, entry] : f->map->header().tensors) {
      const auto [it, inserted] = tensors.emplace(tensor, TensorRef{f, &entry});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor, "' appears in both '",
                                                       it->second.path(), "' and '", f->map->path(),
                                                       "'"));
      }
    }
    open_shards.push_back(*std::move(shard));
  }
  for (const auto& [tensor, file] : shards->weight_map) {
    const auto it = tensors.find(tensor);
    if (it == tensors.end() || it->second.shard != by_file.at(file)) {
      return absl::InvalidArgumentError(absl::StrCat(kIndexFile, " puts tensor '", tensor, "' in '",
                                                     file, "', which does not hold it"));
    }
  }

  const FormatRow& row = FormatRowOf(ckpt->config_.format);
  // <prefix><separator><role>: "." for most formats, "_" for gpt-oss MXFP4 (<prefix>_blocks).
  const std::string separator(row.role_separator);
  const std::string anchor = absl::StrCat(separator, std::string(row.roles[row.anchor_role]));
  std::set<std::string> stored_names;  // every tensor that is a role of a layer
  for (const auto& [tensor, anchor_ref] : tensors) {
    if (!absl::EndsWith(tensor, anchor)) continue;
    const std::string prefix = tensor.substr(0, tensor.size() - anchor.size());
    if (prefix.empty()) {  // a layer no request could name (and no output file could be called)
      return absl::FailedPreconditionError(
          absl::StrCat(anchor_ref.path(), ": tensor '", tensor, "' (format ", std::string(row.name),
                       ") is a layer with an empty name: a layer's tensors are <layer>", anchor,
                       " with a non-empty <layer>"));
    }
    std::vector<TensorRef> refs(static_cast<size_t>(row.role_count));
    std::vector<formats::QuantTensorRef> stored;
    for (int r = 0; r < row.role_count; ++r) {
      const std::string name = absl::StrCat(prefix, separator, std::string(row.roles[r]));
      const auto it = tensors.find(name);
      if (it == tensors.end() && (row.optional_roles >> r & 1u) != 0) {
        stored.push_back({.file = anchor_ref.path(), .entry = nullptr});  // an absent optional role
        continue;
      }
      if (it == tensors.end()) return MissingRole(row, prefix, tensor, anchor_ref.path(), r);
      refs[static_cast<size_t>(r)] = it->second;
      stored.push_back({.file = it->second.path(), .entry = it->second.entry});
      stored_names.insert(name);
    }
    absl::StatusOr<QuantShape> quant_shape =
        formats::QuantShapeFromTensors(row.format, prefix, stored, {.config = &ckpt->config_});
    if (!quant_shape.ok()) return quant_shape.status();
    const QuantShape& shape = *quant_shape;
    if (absl::Status s = ValidateShape(shape, DType::kF16); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(anchor_ref.path(), ": layer '", prefix, "': ", s.message()));
    }
    QuantizedLayer layer;
    layer.name = prefix;
    layer.file = anchor_ref.path();
    layer.view.shape = shape;
    for (size_t r = 0; r < refs.size(); ++r) {
      if (refs[r].entry == nullptr) continue;  // an absent optional role: no range, no pointer
      layer.stored[r] = StoredRange{
          .shard = refs[r].shard->index, .offset = refs[r].file_offset(), .bytes = refs[r].bytes()};
    }
    ckpt->layers_.push_back(std::move(layer));
  }
  // The same rule the other way round: a tensor named like a role of the format is part of a
  // layer, so one left over (not a role of a layer found above: its layer has no anchor) is
  // refused rather than served as a plain tensor. Roles that unquantized tensors are also called
  // (FormatRow::plain_name_roles: the FP8 formats' `.weight`) are left to be plain tensors.
  for (const auto& [tensor, ref] : tensors) {
    if (stored_names.count(tensor) != 0) continue;
    for (int r = 0; r < row.role_count; ++r) {
      if (r == row.anchor_role || (row.plain_name_roles >> r & 1u) != 0) continue;
      const std::string suffix = absl::StrCat(separator, std::string(row.roles[r]));
      if (tensor.size() <= suffix.size() || !absl::EndsWith(tensor, suffix)) continue;
      return MissingRole(row, tensor.substr(0, tensor.size() - suffix.size()), tensor, ref.path(),
                         row.anchor_role);
    }
  }
  if (ckpt->layers_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint '", dir, "' has no quantized layers (no *", anchor, " tensors)"));
  }
  std::sort(ckpt->layers_.begin(), ckpt->layers_.end(),
            [](const QuantizedLayer& a, const QuantizedLayer& b) { return a.name < b.name; });
  for (size_t i = 0; i < ckpt->layers_.size(); ++i)
    ckpt->layers_[i].index = static_cast<int64_t>(i);
  ckpt->copies_.resize(ckpt->layers_.size());
  absl::StatusOr<std::vector<RawTensor>> raw = IndexRawTensors(tensors, stored_names);
  if (!raw.ok()) return raw.status();
  ckpt->raw_tensors_ = *std::move(raw);
  absl::StatusOr<std::string> config_text = ReadConfigText(root / kConfigFile);
  if (!config_text.ok()) return config_text.status();
  ckpt->config_json_ = *std::move(config_text);
  // A format with rules on its stored values (GPTQ's g_idx range) is read at Open whatever
  // `load` says, and checked before any byte is trusted; the server frees the copies of the
  // layers its devices then hold.
  if (load.host_copies || row.check_stored != nullptr) {
    absl::StatusOr<int64_t> read = ckpt->ReadHostCopies({}, load.threads);
    if (!read.ok()) return read.status();
  }
  if (row.check_stored != nullptr) {
    for (const QuantizedLayer& layer : ckpt->layers_) {
      if (absl::Status s = row.check_stored(layer.view); !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat(layer.file, ": layer '", layer.name, "': ", s.message()));
      }
    }
  }
  return ckpt;
}

void LayerPositions::Assign(const std::vector<QuantizedLayer>& layers) {
  names_.clear();
  by_name_.clear();
  for (const QuantizedLayer& layer : layers) {
    by_name_[layer.name] = static_cast<int64_t>(names_.size());
    names_.push_back(layer.name);
  }
}

std::optional<int64_t> LayerPositions::Find(const QuantizedLayer& layer) const {
  if (layer.index >= 0 && layer.index < size() &&
      names_[static_cast<size_t>(layer.index)] == layer.name) {
    return layer.index;
  }
  auto it = by_name_.find(layer.name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

}  // namespace dequantd
