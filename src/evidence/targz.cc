// A streaming ustar + gzip writer and reader for bundles. Our own rather than libarchive: the tau
// binary links only libc dynamically, and bundles need only regular files with short names.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "evidence/internal.h"

namespace tau::evidence::internal {

namespace {

constexpr size_t kBlock = 512;
constexpr size_t kRecord = 20 * kBlock;  // tar's default record size: pad the archive to it
constexpr size_t kBufferBytes = 256 * 1024;

Status WriteAll(int fd, const unsigned char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return IoError("writing the bundle", errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// An octal field, NUL-terminated; sizes beyond its range use GNU's base-256 form.
void PutNumber(char* field, size_t width, int64_t value) {
  std::string octal = fmt::format("{:0{}o}", value, width - 1);
  if (octal.size() <= width - 1) {
    std::memcpy(field, octal.data(), octal.size());
    field[width - 1] = '\0';
    return;
  }
  std::memset(field, 0, width);
  field[0] = static_cast<char>(0x80);
  for (size_t i = width - 1; i > 0 && value > 0; --i, value >>= 8)
    field[i] = static_cast<char>(value & 0xff);
}

bool GetNumber(const char* field, size_t width, int64_t* out) {
  auto u = reinterpret_cast<const unsigned char*>(field);
  if (u[0] & 0x80) {
    if (u[0] != 0x80) return false;  // negative base-256: not for us
    uint64_t v = 0;
    for (size_t i = 1; i < width; ++i) {
      if (v >> 55) return false;
      v = (v << 8) | u[i];
    }
    *out = static_cast<int64_t>(v);
    return true;
  }
  int64_t v = 0;
  size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  bool digits = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v >> 60) return false;
    v = v * 8 + (field[i] - '0');
    digits = true;
  }
  for (; i < width; ++i)
    if (field[i] != '\0' && field[i] != ' ') return false;
  *out = digits ? v : 0;
  return true;
}

int64_t HeaderChecksum(const unsigned char* h) {
  int64_t sum = 0;
  for (size_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  return sum;
}

std::string Field(const char* p, size_t width) { return std::string(p, strnlen(p, width)); }

}  // namespace

struct TarGzWriter::Z {
  z_stream s{};
  bool init = false;
  std::vector<unsigned char> out = std::vector<unsigned char>(kBufferBytes);
  ~Z() {
    if (init) deflateEnd(&s);
  }
};

Result<std::unique_ptr<TarGzWriter>> TarGzWriter::Create(const std::string& path) {
  std::unique_ptr<TarGzWriter> w(new TarGzWriter());
  w->z_ = std::make_unique<Z>();
  // Level 1: logs compress about as well at 1 as at 6 and several times faster.
  if (deflateInit2(&w->z_->s, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    return Internal("zlib deflateInit2 failed");
  w->z_->init = true;
  w->fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return IoError("cannot create " + path, errno);
  return w;
}

TarGzWriter::~TarGzWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status TarGzWriter::Deflate(std::string_view data, bool finish) {
  z_stream& s = z_->s;
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  s.avail_in = static_cast<uInt>(data.size());
  while (true) {
    s.next_out = z_->out.data();
    s.avail_out = static_cast<uInt>(z_->out.size());
    int rc = deflate(&s, finish ? Z_FINISH : Z_NO_FLUSH);
    if (rc == Z_STREAM_ERROR) return Internal("zlib deflate failed");
    size_t n = z_->out.size() - s.avail_out;
    if (n > 0) {
      TAU_RETURN_IF_ERROR(WriteAll(fd_, z_->out.data(), n));
      bytes_out_ += static_cast<int64_t>(n);
    }
    if (finish ? rc == Z_STREAM_END : (s.avail_in == 0 && s.avail_out != 0)) break;
  }
  return Status::Ok();
}

Status TarGzWriter::Begin(const std::string& name, int64_t size, int64_t mtime_s, int mode) {
  if (in_entry_) return Internal("tar entry '" + name + "' started inside another");
  if (!SafeEntryName(name)) return Internal("unsafe tar entry name '" + name + "'");
  unsigned char h[kBlock] = {};
  char* c = reinterpret_cast<char*>(h);
  // ustar splits a long name at a '/' into prefix (155) and name (100).
  std::string prefix, base = name;
  if (name.size() > 100) {
    size_t cut = name.rfind('/', 155);
    if (cut == std::string::npos || name.size() - cut - 1 > 100)
      return InvalidArgument("tar entry name too long for ustar: " + name);
    prefix = name.substr(0, cut);
    base = name.substr(cut + 1);
  }
  std::memcpy(c, base.data(), base.size());
  PutNumber(c + 100, 8, mode & 07777);
  PutNumber(c + 108, 8, 0);
  PutNumber(c + 116, 8, 0);
  PutNumber(c + 124, 12, size);
  PutNumber(c + 136, 12, mtime_s < 0 ? 0 : mtime_s);
  c[156] = '0';
  std::memcpy(c + 257, "ustar", 6);
  std::memcpy(c + 263, "00", 2);
  std::memcpy(c + 265, "tau", 3);
  std::memcpy(c + 297, "tau", 3);
  std::memcpy(c + 345, prefix.data(), prefix.size());
  std::string sum = fmt::format("{:06o}", HeaderChecksum(h));
  std::memcpy(c + 148, sum.data(), 6);
  c[154] = '\0';
  c[155] = ' ';
  TAU_RETURN_IF_ERROR(Deflate(std::string_view(c, kBlock), false));
  in_entry_ = true;
  remaining_ = size;
  written_in_entry_ = 0;
  return Status::Ok();
}

Status TarGzWriter::Write(std::string_view data) {
  if (!in_entry_) return Internal("tar write outside an entry");
  if (static_cast<int64_t>(data.size()) > remaining_)
    return Internal("tar entry longer than its header says");
  remaining_ -= static_cast<int64_t>(data.size());
  written_in_entry_ += static_cast<int64_t>(data.size());
  return Deflate(data, false);
}

Status TarGzWriter::End() {
  if (!in_entry_) return Internal("tar End outside an entry");
  if (remaining_ != 0) return Internal("tar entry shorter than its header says");
  in_entry_ = false;
  size_t pad = (kBlock - static_cast<size_t>(written_in_entry_ % kBlock)) % kBlock;
  static const char zeros[kBlock] = {};
  return Deflate(std::string_view(zeros, pad), false);
}

Status TarGzWriter::Add(const std::string& name, std::string_view data, int64_t mtime_s) {
  TAU_RETURN_IF_ERROR(Begin(name, static_cast<int64_t>(data.size()), mtime_s));
  TAU_RETURN_IF_ERROR(Write(data));
  return End();
}

Status TarGzWriter::Finish() {
  if (in_entry_) return Internal("tar Finish inside an entry");
  // Two zero blocks end the archive; pad the whole to a multiple of the record size. The tar
  // stream's length is tracked through the deflate input count.
  uint64_t total = z_->s.total_in + 2 * kBlock;
  size_t pad = 2 * kBlock + (kRecord - total % kRecord) % kRecord;
  std::string zeros(pad, '\0');
  TAU_RETURN_IF_ERROR(Deflate(zeros, true));
  if (::fsync(fd_) != 0) return IoError("syncing the bundle", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return IoError("closing the bundle", errno);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Reader

Status ReadTarGz(const std::string& path, const std::function<Status(const TarEntry&)>& on_entry,
                 const std::function<Status(std::string_view)>& on_data) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("no such file: " + path);
    return IoError("cannot open " + path, errno);
  }
  struct Closer {
    int fd;
    z_stream* s = nullptr;
    ~Closer() {
      ::close(fd);
      if (s) inflateEnd(s);
    }
  } closer{fd};
  z_stream s{};
  if (inflateInit2(&s, 15 + 16) != Z_OK) return Internal("zlib inflateInit2 failed");
  closer.s = &s;

  std::vector<unsigned char> in(kBufferBytes), out(kBufferBytes);
  // Tar parsing state over the decompressed stream.
  unsigned char header[kBlock];
  size_t header_fill = 0;
  int64_t data_left = 0, pad_left = 0;
  int zero_blocks = 0;
  bool ended = false;  // two zero blocks seen: only zeros may follow
  int64_t tar_offset = 0;
  bool stream_end = false;
  int64_t compressed_offset = 0;

  auto feed = [&](const unsigned char* p, size_t n) -> Status {
    while (n > 0) {
      if (data_left > 0) {
        size_t take = static_cast<size_t>(std::min<int64_t>(data_left, static_cast<int64_t>(n)));
        TAU_RETURN_IF_ERROR(on_data(std::string_view(reinterpret_cast<const char*>(p), take)));
        data_left -= static_cast<int64_t>(take);
        p += take;
        n -= take;
        tar_offset += static_cast<int64_t>(take);
        continue;
      }
      if (pad_left > 0) {
        size_t take = static_cast<size_t>(std::min<int64_t>(pad_left, static_cast<int64_t>(n)));
        pad_left -= static_cast<int64_t>(take);
        p += take;
        n -= take;
        tar_offset += static_cast<int64_t>(take);
        continue;
      }
      if (ended) {
        for (size_t i = 0; i < n; ++i)
          if (p[i] != 0)
            return InvalidArgument(fmt::format(
                "the archive is corrupt: data after its end (tar offset {})", tar_offset + i));
        tar_offset += static_cast<int64_t>(n);
        return Status::Ok();
      }
      size_t take = std::min(kBlock - header_fill, n);
      std::memcpy(header + header_fill, p, take);
      header_fill += take;
      p += take;
      n -= take;
      if (header_fill < kBlock) continue;
      header_fill = 0;
      int64_t at = tar_offset;
      tar_offset += kBlock;
      bool zero = true;
      for (unsigned char b : header)
        if (b != 0) zero = false;
      if (zero) {
        if (++zero_blocks == 2) ended = true;
        continue;
      }
      if (zero_blocks > 0)
        return InvalidArgument(
            fmt::format("the archive is corrupt: a lone zero block before offset {}", at));
      const char* c = reinterpret_cast<const char*>(header);
      int64_t sum = 0;
      if (!GetNumber(c + 148, 8, &sum) || sum != HeaderChecksum(header))
        return InvalidArgument(
            fmt::format("the archive is corrupt: bad tar header checksum at offset {}", at));
      if (std::memcmp(c + 257, "ustar", 5) != 0)
        return InvalidArgument(
            fmt::format("the archive is corrupt: not a ustar header at offset {}", at));
      TarEntry e;
      std::string prefix = Field(c + 345, 155);
      e.name = prefix.empty() ? Field(c, 100) : prefix + "/" + Field(c, 100);
      e.type = c[156] == '\0' ? '0' : c[156];
      e.link = Field(c + 157, 100);
      int64_t mode = 0;
      if (!GetNumber(c + 100, 8, &mode) || !GetNumber(c + 124, 12, &e.size) || e.size < 0)
        return InvalidArgument(
            fmt::format("the archive is corrupt: bad tar header fields at offset {}", at));
      e.mode = static_cast<int>(mode);
      TAU_RETURN_IF_ERROR(on_entry(e));
      data_left = e.size;
      pad_left = (kBlock - e.size % kBlock) % kBlock;
    }
    return Status::Ok();
  };

  while (!stream_end) {
    ssize_t got = ::read(fd, in.data(), in.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      return IoError("cannot read " + path, errno);
    }
    if (got == 0) break;
    s.next_in = in.data();
    s.avail_in = static_cast<uInt>(got);
    while (s.avail_in > 0 && !stream_end) {
      s.next_out = out.data();
      s.avail_out = static_cast<uInt>(out.size());
      uInt avail_before = s.avail_in;
      int rc = inflate(&s, Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
        return InvalidArgument(fmt::format("the archive is corrupt: gzip error near byte {} ({})",
                                           compressed_offset + (got - s.avail_in),
                                           s.msg ? s.msg : "zlib"));
      compressed_offset += avail_before - s.avail_in;
      TAU_RETURN_IF_ERROR(feed(out.data(), out.size() - s.avail_out));
      if (rc == Z_STREAM_END) stream_end = true;
    }
    if (stream_end && s.avail_in > 0)
      return InvalidArgument("the archive is corrupt: data after the end of the gzip stream");
    if (stream_end) {
      // Anything after the gzip stream in the file is tampering or damage too.
      unsigned char extra;
      ssize_t more = ::read(fd, &extra, 1);
      if (more > 0)
        return InvalidArgument("the archive is corrupt: data after the end of the gzip stream");
    }
  }
  if (!stream_end) return InvalidArgument("the archive is corrupt: the gzip stream is truncated");
  if (data_left > 0 || pad_left > 0 || header_fill > 0)
    return InvalidArgument("the archive is corrupt: the tar stream is truncated");
  if (!ended) return InvalidArgument("the archive is corrupt: the tar end marker is missing");
  return Status::Ok();
}

}  // namespace tau::evidence::internal
