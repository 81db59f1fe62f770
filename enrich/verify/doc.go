// Package verify asks an image registry what the kubelet's message can only
// hint at: does the tag exist, does the repository, which platforms does an
// index carry, did the registry answer 429 and with which limit. A verified
// answer replaces a cause read from text (enrich's rules) with one the
// registry decided (api/eventpipe/v1 DecidedByRegistry), with words a user
// can act on ("tag 0.0.9 does not exist in ghcr.io/acme/app; newest tags by
// version: 0.0.8, 0.0.7").
//
// It sits downstream of enrich and is never on its hot path: enrich stays
// pure. The agent (verify.pull_failures, verify.supervisor) calls Check
// from goroutines of its own beside the event path, which only reads
// answers already cached (Cached); `eventpipe diagnose --verify` calls it
// for the images it shows. Nothing here runs without an explicit opt-in by
// whoever builds a Verifier. registrytest is the registry its tests (and
// the agent's and the CLI's) run against.
//
// Contract:
//   - Every registry call is bounded in time (Config.Timeout), made once
//     (go-containerregistry's retries are off: a retry is the next check,
//     after the cache entry expires), and counted
//     (eventpipe_verify_registry_calls_total{answer}).
//   - Answers are cached per reference, platform and credential for
//     Config.CacheTTL, and calls are rate-limited per registry host
//     (Config.RatePerRegistry, Config.Burst): a check over the limit is not
//     made and answers AnswerThrottled, so no registry is hammered however
//     many pods fail on the same image.
//   - The credential is the Keychain the Verifier was built with: anonymous
//     when none (the agent's default), the user's docker/crane configuration
//     (authn.DefaultKeychain) on the user side. A Verifier never reads
//     Kubernetes Secrets itself.
//   - Only AnswerTagNotFound, AnswerRepoNotFound, AnswerUnauthorized,
//     AnswerDenied, AnswerRateLimited and AnswerPlatformMissing establish a
//     cause (Result.Conclusive); an unreachable registry, a timeout or a
//     throttled check leave the text diagnosis as it was.
//
// A Verifier is safe for concurrent use and starts no goroutines.
package verify
