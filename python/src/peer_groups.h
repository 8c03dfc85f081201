// The peer groups llmk.distributed has set up in this process, by id: the op
// all_reduce_add_rmsnorm_ takes a group's id (an int in its schema) and finds its buffers
// here. llmk._C's register_peer_group / unregister_peer_group (module.cc) fill the table.
#pragma once

#include <cstdint>

#include "llmk/all_reduce.h"

namespace llmk::torch_ops {

int64_t register_peer_group(const PeerGroup& group);
void unregister_peer_group(int64_t id);
// The group of `id`; an id that is not registered throws an error naming `op`.
PeerGroup peer_group(const char* op, int64_t id);

}  // namespace llmk::torch_ops
