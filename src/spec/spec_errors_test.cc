// Error reporting: exact format, positions, "did you mean", all errors at once in file order, the
// malformed corpus under tests/data/spec/invalid, and a mutation test that ParseSpec never crashes
// or throws.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "spec/spec.h"
#include "spec/spec_test_util.h"

namespace tau::spec {
namespace {

using testing::Direct;
using testing::Errors;
using testing::Manifest;
using testing::Parse;
using testing::ReadText;
using testing::SpecDataDir;

TEST(SpecErrors, ExactFormatOfAnUnknownField) {
  ParseOutcome outcome = Parse(
      "schema_version: 1\n"
      "name: demo\n"
      "run:\n"
      "  entrypoint: train.py\n"
      "compute:\n"
      "  gpus: 1\n"
      "  worker: 2\n");
  ASSERT_EQ(outcome.diagnostics.size(), 1u);
  const Diagnostic& d = outcome.diagnostics[0];
  EXPECT_EQ(d.file, "tau.yaml");
  EXPECT_EQ(d.line, 7);
  EXPECT_EQ(d.column, 3);
  EXPECT_EQ(outcome.ErrorText(),
            "tau.yaml:7:3: error: unknown field 'worker' in 'compute' (did you mean 'workers'?)");
  EXPECT_FALSE(outcome.spec.has_value());
}

TEST(SpecErrors, FileNameIsUsedVerbatim) {
  ParseOutcome outcome = ParseSpec("engine: job\nname: a\n", "jobs/x/tau.yaml");
  EXPECT_EQ(
      outcome.ErrorText(),
      "jobs/x/tau.yaml:1:1: error: missing required field 'entrypoint' (or its alias 'script')");
}

TEST(SpecErrors, AllErrorsInFileOrder) {
  ParseOutcome outcome = Parse(
      "schema_version: 1\n"        // 1
      "name: Bad_Name\n"           // 2
      "run:\n"                     // 3
      "  entrypoint: a/../../x\n"  // 4
      "  workload_kind: ray\n"     // 5
      "compute:\n"                 // 6
      "  worker: 2\n"              // 7
      "  gpus: lots\n"             // 8
      "  memory: 64GB\n"           // 9
      "runtime:\n"                 // 10
      "  env:\n"                   // 11
      "    1X: a\n"                // 12
      "resilience:\n"              // 13
      "  retry_on: [Unknown]\n"    // 14
      "  backoff_initial: 10m\n"   // 15
      "  backoff_max: 1m\n"        // 16
      "polcy: {}\n");              // 17
  std::vector<std::pair<int, int>> where;
  for (const Diagnostic& d : outcome.diagnostics) where.emplace_back(d.line, d.column);
  EXPECT_EQ(
      where,
      (std::vector<std::pair<int, int>>{
          {2, 7}, {4, 15}, {5, 18}, {7, 3}, {8, 9}, {9, 11}, {12, 5}, {14, 14}, {15, 20}, {17, 1}}))
      << outcome.ErrorText();
  std::string text = outcome.ErrorText();
  EXPECT_NE(text.find("tau.yaml:17:1: error: unknown field 'polcy' (did you mean 'policy'?)"),
            std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 9);
}

TEST(SpecErrors, CrossFieldErrorsAreSortedIntoFileOrder) {
  ParseOutcome outcome = Parse(
      "compute:\n"
      "  gpus: 1\n"
      "  gpus_per_worker: 2\n"
      "name: x\n"
      "engine: job\n"
      "entrypoint: a.py\n"
      "policy:\n"
      "  topolgy: any\n");
  ASSERT_EQ(outcome.diagnostics.size(), 2u) << outcome.ErrorText();
  EXPECT_EQ(outcome.diagnostics[0].line, 3);
  EXPECT_EQ(outcome.diagnostics[1].line, 8);
}

TEST(SpecErrors, UnknownFieldsAtEveryLevel) {
  struct Case {
    std::string yaml;
    std::string expected;
  };
  std::vector<Case> cases = {
      {Manifest("runtme: {}\n"), "5:1: error: unknown field 'runtme' (did you mean 'runtime'?)"},
      {Manifest("runtime:\n  imag: x\n"), "6:3: error: unknown field 'imag' in 'runtime'"},
      {Manifest("policy:\n  queu: x\n"),
       "unknown field 'queu' in 'policy' (did you mean 'queue'?)"},
      {Manifest("storage:\n  outptu: x\n"), "in 'storage' (did you mean 'output'?)"},
      {Manifest("resilience:\n  max_retry: 1\n"), "(did you mean 'max_retries'?)"},
      {Manifest("metrics:\n  histroy: []\n"), "(did you mean 'history'?)"},
      {Manifest("experiment:\n  projet: x\n"), "(did you mean 'project'?)"},
      {Manifest("resource_naming:\n  prefx: x\n"), "(did you mean 'prefix'?)"},
      {Manifest("profiler:\n  mod: x\n"),
       "unknown field 'mod' in 'profiler' (did you mean 'mode'?)"},
      {Manifest("workflow:\n  extra_script: x\n"), "(did you mean 'extra_scripts'?)"},
      {Manifest("artifacts:\n  checkpoints: x\n"), "(did you mean 'checkpoint'?)"},
      {Manifest("storage:\n  image_assets:\n    - {name: a, image: b, mount_path: /c, nam: d}\n"),
       "unknown field 'nam' in 'storage.image_assets[0]' (did you mean 'name'?)"},
      {Direct("run:\n  sourc: {}\n"), "unknown field 'sourc' in 'run' (did you mean 'source'?)"},
      {Direct("run:\n  source:\n    imag: x\n"), "unknown field 'imag' in 'run.source'"},
      {Direct("runtime:\n  security:\n    level: x\n"),
       "unknown field 'level' in 'runtime.security'"},
      {Direct("metrics:\n  offload:\n    output: x\n"),
       "unknown field 'output' in 'metrics.offload'"},
      {Direct("compute:\n  gpu: 1\n"), "(did you mean 'gpus'?)"},
      {Direct("zzzzzzzz: 1\n"), "4:1: error: unknown field 'zzzzzzzz'"},
  };
  for (const Case& c : cases) {
    std::string errors = Errors(c.yaml);
    EXPECT_NE(errors.find(c.expected), std::string::npos) << errors << "\nwanted: " << c.expected;
  }
}

TEST(SpecErrors, ControlCharactersInNamesAreEscaped) {
  std::string errors = Errors(Manifest("\"bad\\nkey\": 1\nruntime:\n  env:\n    \"A\\tB\": x\n"));
  EXPECT_NE(errors.find("unknown field 'bad\\x0akey'"), std::string::npos) << errors;
  EXPECT_NE(errors.find("'A\\x09B' is not a valid environment variable name"), std::string::npos)
      << errors;
  EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 1) << errors;
}

TEST(SpecErrors, EscapesThatMakeBytesOtherThanUtf8AreRefused) {
  // YAML's \N (U+0085) comes out of the parser as the single byte 0x85, which no JSON record can
  // hold (found by spec_fuzz).
  std::string errors = Errors(Manifest("runtime:\n  env:\n    A: \"a\\N b\"\n"));
  EXPECT_NE(errors.find("runtime.env.A: byte 1 is not UTF-8 text"), std::string::npos) << errors;
  // The character itself, or its \u escape, is fine.
  EXPECT_TRUE(
      spec::ParseSpec(Manifest("runtime:\n  env:\n    A: \"a\\u00e9 \u00e9\"\n"), "tau.yaml").ok());
}

TEST(SpecErrors, NoHintWhenNothingIsClose) {
  std::string errors = Errors(Manifest("compute:\n  bananas: 1\n"));
  EXPECT_EQ(errors, "tau.yaml:6:3: error: unknown field 'bananas' in 'compute'");
}

TEST(SpecErrors, HintsAtTheOtherShape) {
  EXPECT_NE(
      Errors(Manifest("compute:\n  gpus_per_worker: 1\n")).find("belongs to the direct shape"),
      std::string::npos);
  EXPECT_NE(Errors(Manifest("compute:\n  worker_cpu: 1\n")).find("(did you mean 'worker_cpus'?)"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("compute:\n  worker_memory_limit: 1Gi\n"))
                .find("belongs to the direct shape"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("resource_naming:\n  prefix: x\n")).find("belongs to the manifest shape"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("profiler: {}\n")).find("belongs to the manifest shape"),
            std::string::npos);
}

TEST(SpecErrors, ShapeDetection) {
  EXPECT_EQ(
      Errors("name: a\nrun:\n  entrypoint: a.py\n"),
      "tau.yaml:1:1: error: cannot tell the spec's shape: add 'schema_version: 1' (manifest shape) "
      "or 'engine: job|rayjob' (direct shape)");
  EXPECT_NE(Errors("engine: job\nschema_version: 1\nname: a\n")
                .find("tau.yaml:2:1: error: both 'schema_version' (manifest shape) and 'engine'"),
            std::string::npos);
  EXPECT_NE(Errors("schema_version: 2\nname: a\nrun: {entrypoint: a.py}\n")
                .find("tau.yaml:1:17: error: schema_version: unsupported version 2"),
            std::string::npos);
  EXPECT_NE(Errors("schema_version: 1.0\nname: a\nrun: {entrypoint: a.py}\n")
                .find("expected an integer, got a number (1.0)"),
            std::string::npos);
  EXPECT_NE(Errors("schema_version: \nname: a\nrun: {entrypoint: a.py}\n")
                .find("tau.yaml:1:1: error: schema_version: expected an integer, got null"),
            std::string::npos);
}

TEST(SpecErrors, DuplicateKeys) {
  EXPECT_EQ(Errors("schema_version: 1\nname: a\nname: b\nrun: {entrypoint: a.py}\n"),
            "tau.yaml:3:1: error: duplicate field 'name' (first given on line 2)");
  EXPECT_NE(Errors(Direct("compute: {workers: 1, workers: 2}\n"))
                .find("tau.yaml:4:23: error: duplicate field 'workers' in 'compute' (first given "
                      "on line 4)"),
            std::string::npos);
  EXPECT_NE(Errors(Direct("policy:\n  node_selector: {a: b, a: c}\n")).find("duplicate field 'a'"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("eval: {a: 1, a: 2}\n")).find("eval: duplicate field 'a'"),
            std::string::npos);
}

TEST(SpecErrors, ABadEnvValueDoesNotHideTheOtherEntriesErrors) {
  std::string errors =
      Errors(Manifest("runtime:\n"
                      "  env:\n"
                      "    GOOD: x\n"
                      "    NESTED: {a: 1}\n"
                      "    1BAD: y\n"));
  EXPECT_NE(errors.find("runtime.env.NESTED: expected a string, got a mapping"), std::string::npos)
      << errors;
  EXPECT_NE(errors.find("'1BAD' is not a valid environment variable name"), std::string::npos)
      << errors;
}

TEST(SpecErrors, MergeKeysAndEmptyNamesAreExplained) {
  std::string merge = Errors(
      "base: &b {gpus: 1}\nschema_version: 1\nname: demo\nrun:\n  entrypoint: train.py\n"
      "compute:\n  <<: *b\n");
  EXPECT_NE(merge.find("compute: YAML merge keys ('<<') are not supported"), std::string::npos)
      << merge;
  std::string empty = Errors(Manifest("runtime:\n  env:\n    \"\": x\n"));
  EXPECT_NE(empty.find("runtime.env: a name must not be empty"), std::string::npos) << empty;
}

TEST(SpecErrors, NullsAndWrongContainers) {
  EXPECT_EQ(Errors(Manifest("compute:\n")),
            "tau.yaml:5:1: error: compute: expected a mapping, got null");
  EXPECT_EQ(Errors(Manifest("compute: ~\n")),
            "tau.yaml:5:10: error: compute: expected a mapping, got null");
  EXPECT_EQ(Errors(Manifest("compute: 3\n")),
            "tau.yaml:5:10: error: compute: expected a mapping, got an integer (3)");
  EXPECT_EQ(Errors(Manifest("compute: [workers]\n")),
            "tau.yaml:5:10: error: compute: expected a mapping, got a list");
  EXPECT_NE(Errors(Manifest("eval: ~\n")).find("eval: expected a mapping, got null"),
            std::string::npos);
  EXPECT_NE(
      Errors(Manifest("profiler:\n  mode:\n")).find("profiler.mode: expected a value, got null"),
      std::string::npos);
}

TEST(SpecErrors, YamlLevelProblems) {
  EXPECT_EQ(Errors(""),
            "tau.yaml:1:1: error: the file is empty: expected fields such as "
            "'schema_version: 1' or 'engine: job'");
  EXPECT_NE(Errors("   \n\n# only a comment\n").find("the file is empty"), std::string::npos);
  EXPECT_NE(Errors("- a\n- b\n")
                .find("1:1: error: expected a mapping of fields at the top level, got a list"),
            std::string::npos);
  EXPECT_NE(Errors("42\n").find("got an integer (42)"), std::string::npos);
  EXPECT_NE(Errors("~\n").find("the file is empty"), std::string::npos);
  EXPECT_NE(Errors("name: [unclosed\n")
                .find("tau.yaml:1:7: error: this '[' is never closed: add the ']' that ends it "
                      "(YAML syntax error at 2:1: "),
            std::string::npos);
  EXPECT_NE(Errors("engine: job\nname: a: b\n").find("tau.yaml:2:8: error: YAML syntax error"),
            std::string::npos);
  // yaml-cpp ends an unclosed quote at the end of the file; the spec says where it opened.
  EXPECT_NE(Errors("schema_version: 1\nname: \"unterminated\n")
                .find("tau.yaml:2:7: error: this double-quoted string is never closed"),
            std::string::npos);
  EXPECT_EQ(Errors("schema_version: 1\nname: x\nrun:\n  entrypoint: 'main.py\n"),
            "tau.yaml:4:15: error: this single-quoted string is never closed: add its closing ' "
            "(YAML would end it at the end of the file)");
  // An unclosed bracket: at the bracket, not where the parser gave up (said too).
  const std::string bracket = Errors(
      "schema_version: 1\nname: x\nrun:\n  entrypoint: main.py\n  args: [a, b\ncompute:\n"
      "  gpus: 1\n");
  EXPECT_EQ(bracket.rfind("tau.yaml:5:9: error: this '[' is never closed: add the ']' that ends "
                          "it (YAML syntax error at 6:8: ",
                          0),
            0u)
      << bracket;
  EXPECT_NE(
      Errors("engine: job\nname:\ta\n\tentrypoint: x\n").find("tau.yaml:3:1: error: tab character"),
      std::string::npos);
  EXPECT_NE(Errors("a: 1\n---\nb: 2\n").find("tau.yaml:2:1: error: more than one YAML document"),
            std::string::npos);
  // yaml-cpp 0.7 would produce empty documents after these forever; they must fail, and quickly.
  for (const char* text : {"'a', 'b'", "'a',", "[1], 2", "{a: 1},", "&a 'x', 1", "|\n a\n,"}) {
    EXPECT_NE(Errors(text).find("more than one YAML document"), std::string::npos) << text;
  }
  EXPECT_NE(Errors("'a', 'b").find("tau.yaml:1:8: error: YAML syntax error"), std::string::npos);
  EXPECT_NE(Errors("engine: job\nname: &a x\nentrypoint: *b\n").find("YAML syntax error"),
            std::string::npos);
  EXPECT_NE(Errors(Manifest("eval: !!binary aGVsbG8=\n")).find("expected a mapping"),
            std::string::npos);
  EXPECT_NE(
      Errors(Manifest("compute: !custom {workers: 1}\n")).find("unsupported YAML tag '!custom'"),
      std::string::npos);
}

TEST(SpecErrors, LineBreaksAndEncodingsAreThoseOfEveryOtherSpec) {
  // Lone CRs (old Mac line ends) are line breaks: the error is at the right line.
  EXPECT_EQ(Errors("schema_version: 1\rname: x\rrun:\r  entrypoint: main.py\r  bogus: 1\r"),
            "tau.yaml:5:3: error: unknown field 'bogus' in 'run'");
  EXPECT_EQ(
      Errors("schema_version: 1\r\nname: x\r\nrun:\r\n  entrypoint: main.py\r\n  bogus: 1\r\n"),
      "tau.yaml:5:3: error: unknown field 'bogus' in 'run'");
  EXPECT_EQ(
      Errors("\xef\xbb\xbfschema_version: 1\nname: x\nrun:\n  entrypoint: main.py\n  bogus: 1"),
      "tau.yaml:5:3: error: unknown field 'bogus' in 'run'");
  const std::string utf16("\xff\xfes\0c\0h\0", 8);
  EXPECT_NE(Errors(utf16).find("tau.yaml:1:1: error: the file is UTF-16 text"), std::string::npos);
}

TEST(SpecErrors, BytesThatAreNotText) {
  EXPECT_EQ(Errors(std::string("name: a\0b\n", 10)),
            "tau.yaml:1:8: error: control character 0x00 in the file (is it a binary file?)");
  EXPECT_EQ(Errors("name: caf\xc3\x28\n"),
            "tau.yaml:1:10: error: invalid UTF-8 byte 0xc3: tau.yaml must be UTF-8 text");
  EXPECT_NE(Errors("\xff\xfe\x6e\x00").find("the file is UTF-16 text"),
            std::string::npos);                                                     // UTF-16
  EXPECT_NE(Errors("a: \xed\xa0\x80\n").find("invalid UTF-8"), std::string::npos);  // surrogate
  EXPECT_NE(Errors("a: \xc0\xaf\n").find("invalid UTF-8"), std::string::npos);      // overlong
  EXPECT_NE(Errors("a: \x1b[31m\n").find("control character 0x1b"), std::string::npos);
  // A UTF-8 byte order mark and CRLF line endings are fine.
  EXPECT_TRUE(
      Parse("\xef\xbb\xbfschema_version: 1\r\nname: a\r\nrun:\r\n  entrypoint: a.py\r\n").ok());
}

TEST(SpecErrors, SizeLimit) {
  std::string text = Manifest();
  text += "# " + std::string(kMaxSpecBytes - text.size() - 3, 'x') + "\n";
  ASSERT_EQ(text.size(), kMaxSpecBytes);
  EXPECT_TRUE(Parse(text).ok());
  text += "\n";
  EXPECT_EQ(Errors(text),
            "tau.yaml: error: the file is 1048577 bytes; a spec may be at most 1048576 bytes");
}

TEST(SpecErrors, ManyErrorsAreCapped) {
  std::string text = Manifest();
  for (int i = 0; i < 1000; ++i) text += "unknown_" + std::to_string(i) + ": 1\n";
  ParseOutcome outcome = Parse(text);
  ASSERT_EQ(outcome.diagnostics.size(), 201u);
  EXPECT_EQ(outcome.diagnostics[0].line, 5);
  EXPECT_EQ(outcome.diagnostics[199].line, 204);
  EXPECT_EQ(outcome.diagnostics[200].ToString(), "tau.yaml: error: 800 more errors not shown");
}

TEST(SpecErrors, DeepNestingAndAliasBombs) {
  std::string deep =
      Manifest("eval: " + std::string(100000, '[') + std::string(100000, ']') + "\n");
  EXPECT_NE(Errors(deep).find("nested too deeply"), std::string::npos);
  std::string maps = Manifest("eval:\n");
  for (int i = 1; i < 200; ++i) maps += std::string(2 * i, ' ') + "k:\n";
  maps += std::string(400, ' ') + "k: 1\n";
  EXPECT_FALSE(Parse(maps).ok());
  // Each level doubles the size when aliases are expanded; the recorded-only budget stops it.
  std::string bomb = Manifest("eval:\n  a0: &a0 [x, x]\n");
  for (int i = 1; i < 40; ++i) {
    bomb += "  a" + std::to_string(i) + ": &a" + std::to_string(i) + " [*a" +
            std::to_string(i - 1) + ", *a" + std::to_string(i - 1) + "]\n";
  }
  EXPECT_NE(Errors(bomb).find("eval: value is nested too deeply or is too large"),
            std::string::npos);
  // A self-referencing alias must not loop.
  EXPECT_FALSE(Parse(Manifest("eval: &e {self: *e}\n")).ok());
  EXPECT_FALSE(Parse(Direct("compute: &c {workers: *c}\n")).ok());
}

// Every file in tests/data/spec/invalid starts with "# expect: <text>" and must fail with that
// text.
TEST(SpecInvalidCorpus, EachFileFailsWithItsExpectedError) {
  std::filesystem::path dir = SpecDataDir() / "invalid";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    std::string text = ReadText(entry.path());
    const std::string marker = "# expect: ";
    ASSERT_EQ(text.rfind(marker, 0), 0u) << entry.path() << " has no '# expect:' first line";
    std::string expected = text.substr(marker.size(), text.find('\n') - marker.size());
    ASSERT_FALSE(expected.empty()) << entry.path();
    ParseOutcome outcome;
    ASSERT_NO_THROW(outcome = ParseSpec(text, entry.path().filename().string()));
    EXPECT_FALSE(outcome.ok()) << entry.path();
    EXPECT_NE(outcome.ErrorText().find(expected), std::string::npos)
        << entry.path() << "\nexpected: " << expected << "\ngot:\n"
        << outcome.ErrorText();
  }
  EXPECT_GE(files, 40);
}

// Mutates the corpus files (delete, duplicate, flip, insert YAML punctuation) with a fixed seed:
// ParseSpec must never crash or throw, and must return a spec or at least one diagnostic.
TEST(SpecRobustness, MutatedFilesNeverCrash) {
  std::vector<std::string> seeds;
  for (const char* sub : {"valid", "invalid"}) {
    for (const auto& entry : std::filesystem::directory_iterator(SpecDataDir() / sub)) {
      if (entry.path().extension() == ".yaml" && entry.file_size() < 8192) {
        seeds.push_back(ReadText(entry.path()));
      }
    }
  }
  ASSERT_GE(seeds.size(), 20u);
  std::sort(seeds.begin(), seeds.end());  // directory order varies; the seed must not
  std::mt19937 rng(20240611);
  const std::string punctuation = ":-[]{}&*!|>'\"#%@`,? \n\t\\";
  int parsed = 0, rejected = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    std::string text = seeds[rng() % seeds.size()];
    int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations && !text.empty(); ++m) {
      size_t at = rng() % text.size();
      size_t len = 1 + rng() % std::min<size_t>(16, text.size() - at);
      switch (rng() % 4) {
        case 0:
          text.erase(at, len);
          break;
        case 1:
          text.insert(at, text.substr(at, len));
          break;
        case 2:
          text[at] = static_cast<char>(rng() % 256);
          break;
        default:
          text.insert(at, 1, punctuation[rng() % punctuation.size()]);
          break;
      }
    }
    ParseOutcome outcome;
    ASSERT_NO_THROW(outcome = ParseSpec(text, "fuzz.yaml")) << text;
    ASSERT_EQ(outcome.ok(), outcome.diagnostics.empty()) << text;
    if (outcome.ok()) {
      ++parsed;
      ASSERT_NO_THROW(ConfigHash(*outcome.spec));
    } else {
      ++rejected;
      ASSERT_FALSE(outcome.ErrorText().empty());
      for (const Diagnostic& d : outcome.diagnostics) {
        ASSERT_FALSE(d.message.empty()) << text;
        ASSERT_GE(d.line, 0);
        ASSERT_GE(d.column, 0);
      }
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace tau::spec
