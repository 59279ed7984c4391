// Certificates for tests, made at test time with the openssl command-line tool (EC P-256, valid
// two days): a CA, and server certificates it signs. Header-only; tests only.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

#include <fmt/format.h>

namespace tau::testutil {

// Runs a shell command quietly; true on exit status 0.
inline bool Shell(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// A self-signed CA as DIR/NAME.pem + NAME.key.
inline bool MakeCa(const std::string& dir, const std::string& name) {
  return Shell(fmt::format(
      "cd {0} && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-keyout {1}.key -out {1}.pem -days 2 -subj /CN={1}",
      dir, name));
}

// A certificate for `san` (an openssl subjectAltName value) signed by the CA `ca`, as
// DIR/NAME.pem + NAME.key.
inline bool MakeCert(const std::string& dir, const std::string& ca, const std::string& name,
                     const std::string& san) {
  std::ofstream(dir + "/" + name + ".ext") << "subjectAltName=" << san << "\n";
  return Shell(fmt::format(
             "cd {0} && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout {1}.key -out {1}.csr -subj /CN={1}",
             dir, name)) &&
         Shell(fmt::format("cd {0} && openssl x509 -req -in {1}.csr -CA {2}.pem -CAkey {2}.key "
                           "-CAcreateserial -out {1}.pem -days 2 -extfile {1}.ext",
                           dir, name, ca));
}

}  // namespace tau::testutil
