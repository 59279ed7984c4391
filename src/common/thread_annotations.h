// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html), as
// LevelDB's port/thread_annotations.h has them: what a field is guarded by and what a function
// requires are checked by the compiler (`-Wthread-safety`, the clang job in scripts/test.sh), not
// only said in comments. Other compilers see nothing.
#pragma once

#if defined(__clang__)
#define TAU_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TAU_THREAD_ANNOTATION(x)
#endif

#define TAU_CAPABILITY(x) TAU_THREAD_ANNOTATION(capability(x))
#define TAU_SCOPED_CAPABILITY TAU_THREAD_ANNOTATION(scoped_lockable)
#define TAU_GUARDED_BY(x) TAU_THREAD_ANNOTATION(guarded_by(x))
#define TAU_PT_GUARDED_BY(x) TAU_THREAD_ANNOTATION(pt_guarded_by(x))
#define TAU_ACQUIRED_BEFORE(...) TAU_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define TAU_ACQUIRED_AFTER(...) TAU_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define TAU_REQUIRES(...) TAU_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define TAU_ACQUIRE(...) TAU_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TAU_RELEASE(...) TAU_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TAU_EXCLUDES(...) TAU_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define TAU_ASSERT_CAPABILITY(x) TAU_THREAD_ANNOTATION(assert_capability(x))
#define TAU_RETURN_CAPABILITY(x) TAU_THREAD_ANNOTATION(lock_returned(x))
#define TAU_NO_THREAD_SAFETY_ANALYSIS TAU_THREAD_ANNOTATION(no_thread_safety_analysis)
