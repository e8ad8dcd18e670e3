//go:build goexperiment.jsonv2 && !go1.27

package events

// Go 1.26 with GOEXPERIMENT=jsonv2 is not a build jetflow supports: its
// encoding/json is the v2 implementation, but TargetVersion's
// UnmarshalJSONFrom, which makes its errors name their member there,
// needs Go 1.27's jsontext (version_jsonv2.go). Build with Go 1.27, or
// with Go 1.26 without the experiment. The undefined name stops the
// build saying so.
const _ = jetflow_needs_Go_1_27_for_GOEXPERIMENT_jsonv2
