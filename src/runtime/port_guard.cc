// PortGuard (runtime.h): two small eBPF programs, attached to the root of the cgroup v2 hierarchy,
// that every connect() on the machine passes through. A connect to a loopback address whose port
// is in the guard's map succeeds only for the uid the map names and for root; anyone else gets
// EPERM. The programs are assembled here by hand (a dozen instructions each), so tau needs no BPF
// compiler or library: the bpf() system call and the kernel's verifier are all.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/hash.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "runtime/runtime.h"

namespace tau::runtime {
namespace {

long Bpf(int cmd, bpf_attr* attr) { return ::syscall(SYS_bpf, cmd, attr, sizeof *attr); }

// A tiny assembler: instructions, and jumps to labels resolved at the end.
class Program {
 public:
  void Emit(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
    bpf_insn i{};
    i.code = code;
    i.dst_reg = dst & 0xf;
    i.src_reg = src & 0xf;
    i.off = off;
    i.imm = imm;
    insns_.push_back(i);
  }
  void MovReg(int dst, int src) { Emit(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0); }
  void MovImm(int dst, int32_t imm) { Emit(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm); }
  void AndImm(int dst, int32_t imm) { Emit(BPF_ALU64 | BPF_AND | BPF_K, dst, 0, 0, imm); }
  void AddImm(int dst, int32_t imm) { Emit(BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm); }
  void LoadWord(int dst, int src, int16_t off) {
    Emit(BPF_LDX | BPF_MEM | BPF_W, dst, src, off, 0);
  }
  void StoreWord(int dst, int16_t off, int src) {
    Emit(BPF_STX | BPF_MEM | BPF_W, dst, src, off, 0);
  }
  // 32-bit comparisons: the words read from the context are 32 bits wide.
  void JumpIfNot(int reg, uint32_t imm, const std::string& label) {
    Jump(BPF_JMP32 | BPF_JNE | BPF_K, reg, 0, static_cast<int32_t>(imm), label);
  }
  void JumpIf(int reg, uint32_t imm, const std::string& label) {
    Jump(BPF_JMP32 | BPF_JEQ | BPF_K, reg, 0, static_cast<int32_t>(imm), label);
  }
  void JumpIfSameReg(int dst, int src, const std::string& label) {
    Jump(BPF_JMP32 | BPF_JEQ | BPF_X, dst, src, 0, label);
  }
  void JumpIfZero64(int reg, const std::string& label) {
    Jump(BPF_JMP | BPF_JEQ | BPF_K, reg, 0, 0, label);
  }
  void Goto(const std::string& label) { Jump(BPF_JMP | BPF_JA, 0, 0, 0, label); }
  void LoadMapFd(int dst, int fd) {
    Emit(BPF_LD | BPF_DW | BPF_IMM, dst, BPF_PSEUDO_MAP_FD, 0, fd);
    Emit(0, 0, 0, 0, 0);
  }
  void Call(int helper) { Emit(BPF_JMP | BPF_CALL, 0, 0, 0, helper); }
  void Exit() { Emit(BPF_JMP | BPF_EXIT, 0, 0, 0, 0); }
  void Label(const std::string& name) { labels_[name] = insns_.size(); }

  std::vector<bpf_insn> Resolved() const {
    std::vector<bpf_insn> out = insns_;
    for (const auto& [at, label] : fixups_)
      out[at].off =
          static_cast<int16_t>(static_cast<long>(labels_.at(label)) - static_cast<long>(at) - 1);
    return out;
  }

 private:
  void Jump(uint8_t code, int dst, int src, int32_t imm, const std::string& label) {
    fixups_.emplace_back(insns_.size(), label);
    Emit(code, static_cast<uint8_t>(dst), static_cast<uint8_t>(src), 0, imm);
  }
  std::vector<bpf_insn> insns_;
  std::map<std::string, size_t> labels_;
  std::vector<std::pair<size_t, std::string>> fixups_;
};

constexpr int kIp4 = offsetof(bpf_sock_addr, user_ip4);
constexpr int kIp6 = offsetof(bpf_sock_addr, user_ip6);
constexpr int kPort = offsetof(bpf_sock_addr, user_port);

// The common tail: the destination port (r6 holds the context) looked up in the map; allowed when
// absent, when the caller is root or the port's owner.
void EmitLookup(Program& p, int map_fd) {
  p.Label("lookup");
  p.LoadWord(2, 6, kPort);  // network byte order in the low 16 bits, as the map's keys are
  p.StoreWord(10, -4, 2);
  p.LoadMapFd(1, map_fd);
  p.MovReg(2, 10);
  p.AddImm(2, -4);
  p.Call(BPF_FUNC_map_lookup_elem);
  p.JumpIfZero64(0, "allow");
  p.LoadWord(7, 0, 0);                   // the owner's uid
  p.Call(BPF_FUNC_get_current_uid_gid);  // uid in the low 32 bits
  p.JumpIf(0, 0, "allow");
  p.JumpIfSameReg(0, 7, "allow");
  p.MovImm(0, 0);  // refused: connect() fails with EPERM
  p.Exit();
  p.Label("allow");
  p.MovImm(0, 1);
  p.Exit();
}

// The addresses that reach this machine's loopback listeners: 127/8, and the unspecified address
// (a connect to 0.0.0.0 goes to this host).
std::vector<bpf_insn> Connect4(int map_fd) {
  Program p;
  p.MovReg(6, 1);
  p.LoadWord(2, 6, kIp4);
  p.JumpIf(2, 0, "lookup");
  p.AndImm(2, 0xff);  // the first octet (network order: the lowest byte)
  p.JumpIfNot(2, 127, "allow");
  p.Goto("lookup");
  EmitLookup(p, map_fd);
  return p.Resolved();
}

// ::1 and ::, and the IPv4 ones mapped (::ffff:127.x.y.z, ::ffff:0.0.0.0).
std::vector<bpf_insn> Connect6(int map_fd) {
  Program p;
  p.MovReg(6, 1);
  p.LoadWord(2, 6, kIp6);
  p.JumpIfNot(2, 0, "allow");
  p.LoadWord(2, 6, kIp6 + 4);
  p.JumpIfNot(2, 0, "allow");
  p.LoadWord(2, 6, kIp6 + 8);
  p.JumpIf(2, 0, "zero_prefix");
  p.JumpIfNot(2, htonl(0xffff), "allow");
  p.LoadWord(2, 6, kIp6 + 12);
  p.JumpIf(2, 0, "lookup");
  p.AndImm(2, 0xff);
  p.JumpIfNot(2, 127, "allow");
  p.Goto("lookup");
  p.Label("zero_prefix");
  p.LoadWord(2, 6, kIp6 + 12);
  p.JumpIf(2, 0, "lookup");
  p.JumpIfNot(2, htonl(1), "allow");
  p.Goto("lookup");
  EmitLookup(p, map_fd);
  return p.Resolved();
}

// The mount point of the cgroup v2 hierarchy ("" when none is mounted).
std::string CgroupV2Root() {
  std::ifstream mounts("/proc/self/mounts");
  std::string line;
  while (std::getline(mounts, line)) {
    std::istringstream fields(line);
    std::string device, where, type;
    fields >> device >> where >> type;
    if (type == "cgroup2") return where;
  }
  return "";
}

void SetName(char (&dst)[BPF_OBJ_NAME_LEN], const std::string& name) {
  std::strncpy(dst, name.c_str(), BPF_OBJ_NAME_LEN - 1);
}

}  // namespace

namespace {
Mutex last_outcome_mu;
std::string last_outcome TAU_GUARDED_BY(last_outcome_mu);
}  // namespace

std::string PortGuard::LastOutcome() {
  MutexLock lock(&last_outcome_mu);
  return last_outcome;
}

Result<std::unique_ptr<PortGuard>> PortGuard::Start(const std::string& owner) {
  Result<std::unique_ptr<PortGuard>> started = StartGuard(owner);
  MutexLock lock(&last_outcome_mu);
  last_outcome = started.ok() ? "on" : started.status().message();
  return started;
}

Result<std::unique_ptr<PortGuard>> PortGuard::StartGuard(const std::string& owner) {
  if (::geteuid() != 0) return FailedPrecondition("the server is not root");
  const std::string cgroup = CgroupV2Root();
  if (cgroup.empty()) return FailedPrecondition("no cgroup v2 hierarchy is mounted");
  std::unique_ptr<PortGuard> guard(new PortGuard());
  guard->tag_ = Sha256Hex(owner).substr(0, 8);
  guard->cgroup_fd_ = ::open(cgroup.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (guard->cgroup_fd_ < 0) return IoError("cannot open " + cgroup, errno);
  bpf_attr map{};
  map.map_type = BPF_MAP_TYPE_HASH;
  map.key_size = 4;
  map.value_size = 4;
  map.max_entries = 4096;
  map.map_flags = BPF_F_NO_PREALLOC;  // kernel memory for the ports guarded, not for every slot
  SetName(map.map_name, "tau_p_" + guard->tag_);
  guard->map_fd_ = static_cast<int>(Bpf(BPF_MAP_CREATE, &map));
  if (guard->map_fd_ < 0) return IoError("cannot create a BPF map (bpf)", errno);
  const struct {
    std::vector<bpf_insn> insns;
    bpf_attach_type type;
    std::string name;
  } programs[] = {
      {Connect4(guard->map_fd_), BPF_CGROUP_INET4_CONNECT, "tau_c4_" + guard->tag_},
      {Connect6(guard->map_fd_), BPF_CGROUP_INET6_CONNECT, "tau_c6_" + guard->tag_},
  };
  for (const auto& program : programs) {
    static const char kLicense[] = "Dual BSD/GPL";  // no GPL-only helper is called
    std::string log(16384, '\0');
    bpf_attr load{};
    load.prog_type = BPF_PROG_TYPE_CGROUP_SOCK_ADDR;
    load.expected_attach_type = program.type;
    load.insns = reinterpret_cast<uint64_t>(program.insns.data());
    load.insn_cnt = static_cast<uint32_t>(program.insns.size());
    load.license = reinterpret_cast<uint64_t>(kLicense);
    load.log_buf = reinterpret_cast<uint64_t>(log.data());
    load.log_size = static_cast<uint32_t>(log.size());
    load.log_level = 1;
    SetName(load.prog_name, program.name);
    int fd = static_cast<int>(Bpf(BPF_PROG_LOAD, &load));
    if (fd < 0) {
      const int err = errno;
      log.resize(std::strlen(log.c_str()));
      return IoError("the kernel refused tau's connect guard" +
                         (log.empty() ? std::string() : " (" + std::string(Trim(log)) + ")"),
                     err);
    }
    bpf_attr attach{};
    attach.target_fd = static_cast<uint32_t>(guard->cgroup_fd_);
    attach.attach_bpf_fd = static_cast<uint32_t>(fd);
    attach.attach_type = program.type;
    attach.attach_flags = BPF_F_ALLOW_MULTI;
    long attached = Bpf(BPF_PROG_ATTACH, &attach);
    // The kernel attaches at most 64 programs per cgroup and hook: servers killed without
    // detaching theirs (of homes nobody serves again) would otherwise keep every later one out.
    if (attached != 0 && errno == E2BIG && DetachOrphans(guard->cgroup_fd_) > 0)
      attached = Bpf(BPF_PROG_ATTACH, &attach);
    if (attached != 0) {
      const int err = errno;
      ::close(fd);
      return IoError("cannot attach tau's connect guard to " + cgroup, err);
    }
    guard->attached_.push_back({fd, program.type, program.name});
  }
  return guard;
}

PortGuard::~PortGuard() {
  for (const Attached& a : attached_) {
    bpf_attr detach{};
    detach.target_fd = static_cast<uint32_t>(cgroup_fd_);
    detach.attach_bpf_fd = static_cast<uint32_t>(a.prog_fd);
    detach.attach_type = static_cast<uint32_t>(a.type);
    (void)Bpf(BPF_PROG_DETACH, &detach);
    ::close(a.prog_fd);
  }
  if (map_fd_ >= 0) ::close(map_fd_);
  if (cgroup_fd_ >= 0) ::close(cgroup_fd_);
}

namespace {

// The ids of the BPF programs that some process holds a descriptor of: a program of tau's that
// nobody holds was left attached by a server that died.
std::set<uint32_t> HeldProgramIds() {
  std::set<uint32_t> held;
  DIR* proc = ::opendir("/proc");
  if (!proc) return held;
  while (dirent* p = ::readdir(proc)) {
    if (p->d_name[0] < '1' || p->d_name[0] > '9') continue;
    const std::string fds = fmt::format("/proc/{}/fd", p->d_name);
    DIR* dir = ::opendir(fds.c_str());
    if (!dir) continue;  // gone meanwhile
    while (dirent* f = ::readdir(dir)) {
      if (f->d_name[0] == '.') continue;
      char target[64];
      ssize_t n = ::readlinkat(::dirfd(dir), f->d_name, target, sizeof target - 1);
      if (n <= 0 || std::string_view(target, static_cast<size_t>(n)) != "anon_inode:bpf-prog")
        continue;
      std::ifstream info(fmt::format("/proc/{}/fdinfo/{}", p->d_name, f->d_name));
      std::string line;
      while (std::getline(info, line))
        if (line.rfind("prog_id:", 0) == 0)
          held.insert(static_cast<uint32_t>(std::stoul(line.substr(8))));
    }
    ::closedir(dir);
  }
  ::closedir(proc);
  return held;
}

// Detaches the programs attached for connect() at the cgroup `cgroup_fd` that `doomed` picks (by
// id and name); returns how many.
int DetachWhere(int cgroup_fd, const std::function<bool(uint32_t, const std::string&)>& doomed) {
  int detached = 0;
  for (const bpf_attach_type type : {BPF_CGROUP_INET4_CONNECT, BPF_CGROUP_INET6_CONNECT}) {
    uint32_t ids[256];
    bpf_attr query{};
    query.query.target_fd = static_cast<uint32_t>(cgroup_fd);
    query.query.attach_type = type;
    query.query.prog_ids = reinterpret_cast<uint64_t>(ids);
    query.query.prog_cnt = 256;
    if (Bpf(BPF_PROG_QUERY, &query) != 0) continue;
    for (uint32_t i = 0; i < query.query.prog_cnt && i < 256; ++i) {
      bpf_attr by_id{};
      by_id.prog_id = ids[i];
      int fd = static_cast<int>(Bpf(BPF_PROG_GET_FD_BY_ID, &by_id));
      if (fd < 0) continue;
      bpf_prog_info info{};
      bpf_attr get{};
      get.info.bpf_fd = static_cast<uint32_t>(fd);
      get.info.info_len = sizeof info;
      get.info.info = reinterpret_cast<uint64_t>(&info);
      if (Bpf(BPF_OBJ_GET_INFO_BY_FD, &get) == 0 && doomed(ids[i], info.name)) {
        bpf_attr detach{};
        detach.target_fd = static_cast<uint32_t>(cgroup_fd);
        detach.attach_bpf_fd = static_cast<uint32_t>(fd);
        detach.attach_type = type;
        if (Bpf(BPF_PROG_DETACH, &detach) == 0) ++detached;
      }
      ::close(fd);
    }
  }
  return detached;
}

bool IsTauProgram(const std::string& name) {
  return name.rfind("tau_c4_", 0) == 0 || name.rfind("tau_c6_", 0) == 0;
}

}  // namespace

int PortGuard::DetachLeftOvers(const std::string& owner, const PortGuard* keep) {
  const std::string cgroup = CgroupV2Root();
  if (::geteuid() != 0 || cgroup.empty()) return 0;
  int cgroup_fd = ::open(cgroup.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cgroup_fd < 0) return 0;
  const std::string tag = Sha256Hex(owner).substr(0, 8);
  // The ids of `keep`'s own programs, which stay.
  std::vector<uint32_t> kept;
  for (const Attached& a : keep ? keep->attached_ : std::vector<Attached>()) {
    bpf_prog_info info{};
    bpf_attr get{};
    get.info.bpf_fd = static_cast<uint32_t>(a.prog_fd);
    get.info.info_len = sizeof info;
    get.info.info = reinterpret_cast<uint64_t>(&info);
    if (Bpf(BPF_OBJ_GET_INFO_BY_FD, &get) == 0) kept.push_back(info.id);
  }
  // The same name: a program a former server of this home left attached (it was killed).
  const int detached = DetachWhere(cgroup_fd, [&](uint32_t id, const std::string& name) {
    return std::find(kept.begin(), kept.end(), id) == kept.end() &&
           (name == "tau_c4_" + tag || name == "tau_c6_" + tag);
  });
  ::close(cgroup_fd);
  return detached;
}

int PortGuard::DetachOrphans(int cgroup_fd) {
  // Queried before the descriptors are looked for: a program loaded later is not in the query.
  std::vector<std::pair<uint32_t, std::string>> candidates;
  DetachWhere(cgroup_fd, [&](uint32_t id, const std::string& name) {
    if (IsTauProgram(name)) candidates.emplace_back(id, name);
    return false;
  });
  if (candidates.empty()) return 0;
  const std::set<uint32_t> held = HeldProgramIds();
  return DetachWhere(cgroup_fd, [&](uint32_t id, const std::string& name) {
    return IsTauProgram(name) && !held.count(id) &&
           std::find(candidates.begin(), candidates.end(), std::make_pair(id, name)) !=
               candidates.end();
  });
}

Status PortGuard::Allow(int port, uint32_t uid) {
  if (port <= 0 || port > 65535) return InvalidArgument(fmt::format("no such port: {}", port));
  uint32_t key = htons(static_cast<uint16_t>(port));
  bpf_attr update{};
  update.map_fd = static_cast<uint32_t>(map_fd_);
  update.key = reinterpret_cast<uint64_t>(&key);
  update.value = reinterpret_cast<uint64_t>(&uid);
  update.flags = BPF_ANY;
  if (Bpf(BPF_MAP_UPDATE_ELEM, &update) != 0)
    return IoError(fmt::format("cannot guard port {}", port), errno);
  return Status::Ok();
}

void PortGuard::Release(int port) {
  if (port <= 0 || port > 65535) return;
  uint32_t key = htons(static_cast<uint16_t>(port));
  bpf_attr erase{};
  erase.map_fd = static_cast<uint32_t>(map_fd_);
  erase.key = reinterpret_cast<uint64_t>(&key);
  (void)Bpf(BPF_MAP_DELETE_ELEM, &erase);
}

}  // namespace tau::runtime
