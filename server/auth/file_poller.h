// FilePoller: watches files for replacement or modification by polling stat(2) on an interval.
// Polling (not inotify) because Kubernetes Secret and ConfigMap volumes update by swapping a
// symlinked directory, which inotify on the file path does not report; stat follows the links
// and sees the new file's inode.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dequantd::auth {

class FilePoller {
 public:
  // Every `interval`, stats each of `paths` (following symlinks) and calls `on_change` (from the
  // poller's own thread) when the device, inode, size, mtime or ctime of any of them differs
  // from the last poll, or a file appeared or disappeared. The first comparison is against the
  // state at construction. `on_change` must not destroy the poller.
  FilePoller(std::vector<std::string> paths, std::chrono::milliseconds interval,
             std::function<void()> on_change);
  // Stops polling; waits for an on_change in progress to return.
  ~FilePoller();

  FilePoller(const FilePoller&) = delete;
  FilePoller& operator=(const FilePoller&) = delete;

 private:
  std::string Fingerprint() const;
  void Run();

  const std::vector<std::string> paths_;
  const std::chrono::milliseconds interval_;
  const std::function<void()> on_change_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace dequantd::auth
