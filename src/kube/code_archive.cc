// The inline code archive: a plain ustar archive that `tar -x` in any image reads (GNU tar,
// busybox), base64-encoded. Deterministic (sorted paths, mtime 0, owner 0) so that the same code
// renders the same object. Not compressed: compression would need zlib in the tau binary; the
// size limit is on the archive as shipped.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/hash.h"
#include "common/strings.h"
#include "kube/internal.h"

namespace tau::kube::internal {
namespace {

constexpr size_t kBlock = 512;
// One exec argument may be at most 128 KiB on Linux (MAX_ARG_STRLEN); pieces stay well below.
constexpr size_t kChunkChars = 64 * 1024;

void Octal(char* field, size_t width, uint64_t value) {
  // width-1 octal digits and a NUL, as ustar writes numbers.
  std::string digits = fmt::format("{:0{}o}", value, width - 1);
  std::memcpy(field, digits.data(), width - 1);
  field[width - 1] = '\0';
}

Status CheckPath(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) {
    return InvalidArgument(fmt::format("code file '{}': not a relative path", path));
  }
  for (const std::string& part : Split(path, '/')) {
    if (part.empty() || part == "." || part == "..") {
      return InvalidArgument(
          fmt::format("code file '{}': empty, '.' or '..' path components are not allowed", path));
    }
  }
  return Status::Ok();
}

Status AppendFile(std::string& out, const CodeFile& f) {
  char header[kBlock] = {};
  // Paths over 100 bytes go into the 155-byte prefix field, split at a '/'.
  std::string name = f.path, prefix;
  if (name.size() > 100) {
    size_t cut = name.rfind('/', 155);
    while (cut != std::string::npos && name.size() - cut - 1 > 100) cut = std::string::npos;
    if (cut == std::string::npos || cut == 0) {
      return InvalidArgument(fmt::format(
          "code file '{}': the path is too long for the inline archive (at most 100 characters "
          "per file name and 255 in all)",
          f.path));
    }
    prefix = name.substr(0, cut);
    name = name.substr(cut + 1);
  }
  std::memcpy(header, name.data(), name.size());
  Octal(header + 100, 8, static_cast<uint64_t>(f.mode & 0777));
  Octal(header + 108, 8, 0);  // uid
  Octal(header + 116, 8, 0);  // gid
  Octal(header + 124, 12, f.data.size());
  Octal(header + 136, 12, 0);  // mtime
  header[156] = '0';           // a regular file
  std::memcpy(header + 257, "ustar", 6);
  std::memcpy(header + 263, "00", 2);
  std::memcpy(header + 345, prefix.data(), prefix.size());
  // The checksum is computed with its own field read as spaces.
  std::memset(header + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : header) sum += c;
  std::string digits = fmt::format("{:06o}", sum);
  std::memcpy(header + 148, digits.data(), 6);
  header[154] = '\0';
  header[155] = ' ';
  out.append(header, kBlock);
  out += f.data;
  out.append((kBlock - f.data.size() % kBlock) % kBlock, '\0');
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::string>> CodeArchive(const std::vector<CodeFile>& files) {
  std::vector<const CodeFile*> sorted;
  for (const CodeFile& f : files) {
    TAU_RETURN_IF_ERROR(CheckPath(f.path));
    sorted.push_back(&f);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const CodeFile* a, const CodeFile* b) { return a->path < b->path; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->path == sorted[i - 1]->path) {
      return InvalidArgument(fmt::format("code file '{}' is listed twice", sorted[i]->path));
    }
  }
  std::string tar;
  for (const CodeFile* f : sorted) TAU_RETURN_IF_ERROR(AppendFile(tar, *f));
  tar.append(2 * kBlock, '\0');  // the end-of-archive marker
  if (tar.size() > kMaxInlineCodeBytes) {
    size_t data = 0;
    for (const CodeFile& f : files) data += f.data.size();
    return InvalidArgument(fmt::format(
        "the code directory is {} KiB as an archive ({} files, {} KiB of data); a Kubernetes run "
        "carries its code inside its own object, at most {} KiB: list data sets, checkpoints and "
        "other large files in .tauignore and read them from a storage volume "
        "(storage.data_pvc), or build them into the image (runtime.image)",
        (tar.size() + 1023) / 1024, files.size(), (data + 1023) / 1024,
        kMaxInlineCodeBytes / 1024));
  }
  std::string encoded = Base64Encode(tar);
  std::vector<std::string> chunks;
  for (size_t pos = 0; pos < encoded.size(); pos += kChunkChars) {
    chunks.push_back(encoded.substr(pos, kChunkChars));
  }
  return chunks;
}

}  // namespace tau::kube::internal
