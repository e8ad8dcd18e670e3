package dispatch

import "time"

// WithTimerHorizon returns cfg with timers due within horizon of their
// arming firing from memory, and the notices of longer ones coming lead
// before they are due (docs/adr/0019): two minutes and one in production.
func WithTimerHorizon(cfg Config, horizon, lead time.Duration) Config {
	cfg.soonHorizon, cfg.noticeLead = horizon, lead
	return cfg
}
