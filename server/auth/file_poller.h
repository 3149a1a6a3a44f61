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
  // from the last poll, or a file appeared or disappeared. The first comparison is against
  // `baseline`: Snapshot(paths) taken by the caller before it read the files, so that a change
  // between that read and this constructor is not missed. `on_change` must not destroy the
  // poller.
  FilePoller(std::vector<std::string> paths, std::chrono::milliseconds interval,
             std::function<void()> on_change, std::string baseline);
  // The state of `paths` (device, inode, size, mtime, ctime of each, or the stat error).
  static std::string Snapshot(const std::vector<std::string>& paths);
  // Stops polling; waits for an on_change in progress to return.
  ~FilePoller();

  FilePoller(const FilePoller&) = delete;
  FilePoller& operator=(const FilePoller&) = delete;

 private:
  void Run(std::string last);

  const std::vector<std::string> paths_;
  const std::chrono::milliseconds interval_;
  const std::function<void()> on_change_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace dequantd::auth
