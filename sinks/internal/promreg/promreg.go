// Package promreg registers collectors so that several instances of a
// component share one set of metric vectors on one Registerer: the first
// registration wins and later ones get the collector already registered.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg (nil: nothing) and returns the collector to
// use: c, or the equal collector registered earlier. Any other registration
// error is returned with c.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if reg == nil {
		return c, nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}
