// FilePoller (see file_poller.h).
#include "server/auth/file_poller.h"

#include <sys/stat.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd::auth {

FilePoller::FilePoller(std::vector<std::string> paths, std::chrono::milliseconds interval,
                       std::function<void()> on_change, std::string baseline)
    : paths_(std::move(paths)), interval_(interval), on_change_(std::move(on_change)) {
  thread_ = std::thread([this, last = std::move(baseline)]() mutable { Run(std::move(last)); });
}

FilePoller::~FilePoller() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

std::string FilePoller::Snapshot(const std::vector<std::string>& paths) {
  std::string fingerprint;
  for (const std::string& path : paths) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
      absl::StrAppend(&fingerprint, "errno ", errno, ";");
      continue;
    }
    absl::StrAppend(&fingerprint, st.st_dev, ":", st.st_ino, ":", st.st_size, ":",
                    st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ":", st.st_ctim.tv_sec, ".",
                    st.st_ctim.tv_nsec, ";");
  }
  return fingerprint;
}

void FilePoller::Run(std::string last) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, interval_, [this] { return stop_; })) {
    lock.unlock();
    std::string now = Snapshot(paths_);
    if (now != last) {
      last = std::move(now);
      on_change_();
    }
    lock.lock();
  }
}

}  // namespace dequantd::auth
