// Live views over the server's event stream (GET /api/v1/events): `tau status RUN --watch` and
// `tau top`.
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "client/tau_api.h"
#include "common/strings.h"

namespace tau::cli {
namespace {

using nlohmann::json;

bool IsTerminalState(const std::string& s) {
  return s == "Succeeded" || s == "Failed" || s == "Cancelled";
}

// Splits a text/event-stream into (event, data) pairs; fed the stream's chunks as they come.
class SseParser {
 public:
  template <typename F>
  bool Feed(std::string_view chunk, F&& on_event) {
    buf_.append(chunk);
    size_t end;
    while ((end = buf_.find("\n\n")) != std::string::npos) {
      std::string block = buf_.substr(0, end);
      buf_.erase(0, end + 2);
      std::string type = "message", data;
      size_t pos = 0;
      while (pos <= block.size()) {
        size_t nl = block.find('\n', pos);
        std::string line =
            block.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
        pos = nl == std::string::npos ? block.size() + 1 : nl + 1;
        if (line.rfind("event: ", 0) == 0) type = line.substr(7);
        if (line.rfind("data: ", 0) == 0) data += line.substr(6);
      }
      if (!data.empty() && !on_event(type, data)) return false;
    }
    return true;
  }

 private:
  std::string buf_;
};

// One typed call on a new connection; "" or the error's message.
template <typename T, typename F>
std::string Fetch(const Global& g, T* out, F call) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return conn.status().message();
  client::TauApi tau(conn->get());
  auto got = call(tau);
  if (!got.ok()) return got.status().message();
  *out = std::move(*got);
  return "";
}

std::string FetchRunState(const Global& g, const std::string& run, std::string* state) {
  api::RunDetail detail;
  std::string err = Fetch(g, &detail, [&](client::TauApi& tau) { return tau.GetRun(run); });
  if (err.empty()) *state = detail.run.state;
  return err;
}

std::atomic<bool> g_quit{false};
void OnSignal(int) { g_quit = true; }

// Follows `run`'s events until it ends, calling `on_change` with the run's state at each (and
// first with its state at the start, when `at_start`); "" or the error. A stream can end (a server
// restart): it reconnects until the run is done.
template <typename F>
std::string WaitUntilEnded(const Global& g, const std::string& run, F on_change,
                           bool at_start = false) {
  std::string state;
  if (std::string err = FetchRunState(g, run, &state); !err.empty()) return err;
  if (at_start) on_change(state);
  while (!IsTerminalState(state)) {
    auto conn = ConnectToServer(g.server);
    if (!conn.ok()) return conn.status().message();
    SseParser parser;
    auto status = client::TauApi(conn->get()).StreamEvents(run, [&](std::string_view d) {
      return parser.Feed(d, [&](const std::string& type, const std::string& data) {
        if (type == "hello") {
          // The stream's first poll is its baseline and sends nothing: a run that ended between
          // the fetch above and that poll is in no event, so its state is read again now.
          std::string now;
          if (FetchRunState(g, run, &now).empty() && now != state) {
            on_change(now);
            state = now;
          }
          return !IsTerminalState(state);
        }
        if (type != "run") return true;
        auto ev = api::RunEvent::FromJson(json::parse(data, nullptr, false));
        if (!ev.ok()) return true;
        on_change(ev->state);
        state = ev->state;
        return !IsTerminalState(state);
      });
    });
    if (!status.ok() && !IsTerminalState(state)) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      if (std::string err = FetchRunState(g, run, &state); !err.empty()) return err;
    }
  }
  return "";
}

// The ended run's exit status for the shell.
int EndedRunStatus(const Global& g, const std::string& run, api::Run* out = nullptr) {
  api::RunDetail detail;
  if (std::string err = Fetch(g, &detail, [&](client::TauApi& tau) { return tau.GetRun(run); });
      !err.empty())
    return Fail(err);
  if (out) *out = detail.run;
  return RunExitStatus(detail.run);
}

}  // namespace

int CmdStatusWatch(const Global& g, const std::string& run, Format format) {
  if (!IsRunName(run)) return NoSuchRun(run);
  int rc = CmdStatus(g, run, format);
  if (rc != 0) return rc;
  std::string err = WaitUntilEnded(g, run, [&](const std::string&) {
    std::printf("\n");
    std::fflush(stdout);
    CmdStatus(g, run, format);
  });
  if (!err.empty()) return Fail(err);
  return EndedRunStatus(g, run);
}

int CmdWait(const Global& g, const std::vector<std::string>& runs, bool quiet) {
  int rc = 0;
  for (const std::string& run : runs) {
    if (!IsRunName(run)) {
      if (rc == 0) rc = NoSuchRun(run);
      continue;
    }
    // A progress line on stderr at each change of the run's state; stdout has the end only.
    std::string said;
    auto progress = [&](const std::string& state) {
      if (quiet || state == said) return;
      std::fprintf(stderr, "tau: %s: %s\n", run.c_str(), state.c_str());
      std::fflush(stderr);
      said = state;
    };
    if (std::string err = WaitUntilEnded(g, run, progress, true); !err.empty()) {
      std::fprintf(stderr, "tau: error: %s\n", err.c_str());
      if (rc == 0) rc = kExitTauError;
      continue;
    }
    api::Run ended;
    int status = EndedRunStatus(g, run, &ended);
    std::printf("%s: %s%s\n", run.c_str(), ended.state.c_str(),
                ended.exit_code ? fmt::format(" (exit {})", *ended.exit_code).c_str() : "");
    std::fflush(stdout);
    if (rc == 0) rc = status;
  }
  return rc;
}

int CmdLogsExitStatus(const Global& g, const std::string& run) { return EndedRunStatus(g, run); }

namespace {

// What one frame of `tau top` shows, fetched from the server; `error` when that failed.
struct TopData {
  api::Queues queues;
  api::RunList active, recent;
  api::Gpus gpus;
  std::map<int, std::string> holders;  // GPU index: the runs holding it
  std::string error;
};

TopData FetchTop(const Global& g) {
  TopData d;
  d.error = Fetch(g, &d.queues, [](client::TauApi& tau) { return tau.GetQueues(); });
  if (d.error.empty())
    d.error = Fetch(g, &d.active, [](client::TauApi& tau) {
      client::RunQuery active;
      active.limit = 15;
      active.active = true;
      return tau.ListRuns(active);
    });
  if (d.error.empty())
    d.error = Fetch(g, &d.recent, [](client::TauApi& tau) { return EndedRuns(tau, 8); });
  if (d.error.empty())
    d.error = Fetch(g, &d.gpus, [](client::TauApi& tau) { return tau.GetGpus(); });
  if (d.error.empty() && !d.gpus.inventory.devices.empty())
    d.error = Fetch(g, &d.holders, [](client::TauApi& tau) { return GpuHolders(tau); });
  return d;
}

// Cuts a frame to a terminal of `rows` x `cols` (0: no limit): long lines end in "…", and the
// lines past the last row are counted on it instead.
std::string FitToTerminal(const std::string& frame, int rows, int cols) {
  std::vector<std::string> lines = Split(frame, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  std::string out;
  const size_t max_rows = rows > 0 ? static_cast<size_t>(rows) : lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string line = lines[i];
    const bool last = i + 1 == max_rows && lines.size() > max_rows;
    if (last)
      line = fmt::format("… {} more lines (a taller terminal shows them)", lines.size() - i);
    // Columns are counted in code points: the frame is UTF-8 ("—").
    if (cols > 0) {
      size_t points = 0, cut = std::string::npos;
      for (size_t b = 0; b < line.size(); ++b) {
        if ((static_cast<unsigned char>(line[b]) & 0xC0) == 0x80) continue;
        if (++points == static_cast<size_t>(cols)) cut = b;
      }
      if (points > static_cast<size_t>(cols) && cut != std::string::npos)
        line = line.substr(0, cut) + "…";
    }
    out += line + "\n";
    if (last) break;
  }
  return out;
}

std::string Frame(const TopData& d) {
  if (!d.error.empty()) return fmt::format("tau top: {}\n", d.error);
  const api::Queues& queues = d.queues;
  const api::RunList &active = d.active, &recent = d.recent;
  const api::Gpus& gpus = d.gpus;
  auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[32];
  std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&now));
  std::string out = fmt::format("tau top — {}   (q to quit)\n\nQUEUES\n", when);
  out += fmt::format("  {:<20} {:>8} {:>8}  {}\n", "NAME", "ADMITTED", "PENDING", "USAGE/QUOTA");
  for (const api::Queue& q : queues.queues) {
    std::string usage;
    for (const api::Usage& u : q.usage)
      usage +=
          fmt::format("{}={}/{} ", u.resource, HumanQuantity(u.usage), HumanQuantity(u.nominal));
    out += fmt::format("  {:<20} {:>8} {:>8}  {}\n", q.name, q.admitted, q.pending, usage);
    for (const api::PendingRun& p : q.pending_runs)
      out += fmt::format("    #{:<3} {:<28} {}\n",
                         p.pending.position ? std::to_string(*p.pending.position) : "-", p.name,
                         p.pending.reason.substr(0, 90));
  }
  auto runs = [&](const char* title, const api::RunList& list) {
    out += fmt::format("\n{} ({} in all)\n", title, list.total);
    out += fmt::format("  {:<30} {:<10} {:<12} {:>3}  {}\n", "NAME", "STATE", "QUEUE", "ATT",
                       "REASON");
    for (const api::Run& r : list.runs)
      out += fmt::format("  {:<30} {:<10} {:<12} {:>3}  {}\n", r.name, r.state, r.queue, r.attempts,
                         r.reason.substr(0, 50));
  };
  runs("ACTIVE RUNS", active);
  runs("RECENT RUNS (ended)", recent);
  out += "\nGPUS\n";
  const std::vector<api::GpuDevice>& devices = gpus.inventory.devices;
  if (devices.empty()) out += "  none\n";
  const std::map<int, std::string>& holders = d.holders;
  for (const api::GpuDevice& dev : devices) {
    auto held = holders.find(dev.index);
    out += fmt::format("  {:<3} {:<32} {:<10} {}\n", dev.index, dev.name,
                       dev.health ? dev.health->verdict : std::string(),
                       held == holders.end() ? "-" : held->second);
  }
  return out;
}

}  // namespace

int CmdTop(const Global& g, bool once, Format format) {
  if (IsData(format)) {
    TopData d = FetchTop(g);
    if (!d.error.empty()) return Fail(d.error);
    return PrintData({{"queues", d.queues.ToJson()},
                      {"active", d.active.ToJson()},
                      {"recent", d.recent.ToJson()},
                      {"gpus", d.gpus.ToJson()}},
                     format);
  }
  if (once || !::isatty(STDOUT_FILENO)) {
    std::fputs(Frame(FetchTop(g)).c_str(), stdout);
    return 0;
  }
  // Redraw on each event from the stream, and at least every 2 s (GPU samples are not in it).
  std::atomic<bool> dirty{true};
  std::thread events([&] {
    while (!g_quit) {
      auto conn = ConnectToServer(g.server);
      if (conn.ok()) {
        SseParser parser;
        (void)client::TauApi(conn->get()).StreamEvents("", [&](std::string_view d) {
          return parser.Feed(d, [&](const std::string&, const std::string&) {
            dirty = true;
            return !g_quit.load();
          });
        });
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });
  events.detach();  // it may sit in a read; the process ends with _exit below

  struct sigaction sa {};
  sa.sa_handler = OnSignal;  // no SA_RESTART: poll() below returns at once
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  termios saved{};
  bool raw = ::isatty(STDIN_FILENO) && ::tcgetattr(STDIN_FILENO, &saved) == 0;
  if (raw) {
    termios t = saved;
    t.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    t.c_cc[VMIN] = 0;
    t.c_cc[VTIME] = 0;
    ::tcsetattr(STDIN_FILENO, TCSANOW, &t);
  }
  std::fputs("\x1b[?1049h\x1b[?25l", stdout);  // alternate screen, hide the cursor
  auto last = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  while (!g_quit) {
    auto now = std::chrono::steady_clock::now();
    if (dirty.exchange(false) || now - last >= std::chrono::seconds(2)) {
      last = now;
      winsize ws{};
      const bool sized = ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0;
      std::string frame =
          FitToTerminal(Frame(FetchTop(g)), sized ? ws.ws_row : 0, sized ? ws.ws_col : 0);
      std::fputs("\x1b[H\x1b[2J", stdout);
      std::fputs(frame.c_str(), stdout);
      std::fflush(stdout);
    }
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (::poll(&p, 1, 250) > 0) {
      char c = 0;
      if (::read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q' || c == 3)) g_quit = true;
    }
  }
  std::fputs("\x1b[?25h\x1b[?1049l", stdout);
  std::fflush(stdout);
  if (raw) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved);
  // The event thread may be blocked reading the stream; ending the process is the clean way out.
  std::_Exit(0);
}

}  // namespace tau::cli
