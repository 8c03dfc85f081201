#include "peer_groups.h"

#include <map>
#include <mutex>

#include "llmk/error.h"

namespace llmk::torch_ops {

namespace {

std::mutex groups_mutex;
std::map<int64_t, PeerGroup> groups;
int64_t next_id = 1;

}  // namespace

int64_t register_peer_group(const PeerGroup& group) {
  const std::lock_guard<std::mutex> lock(groups_mutex);
  groups[next_id] = group;
  return next_id++;
}

void unregister_peer_group(int64_t id) {
  const std::lock_guard<std::mutex> lock(groups_mutex);
  groups.erase(id);
}

PeerGroup peer_group(const char* op, int64_t id) {
  const std::lock_guard<std::mutex> lock(groups_mutex);
  const auto it = groups.find(id);
  LLMK_CHECK(it != groups.end(), op, ": no peer group has id ", id,
             " (llmk.distributed sets groups up; a group's id is valid until it is released)");
  return it->second;
}

}  // namespace llmk::torch_ops
