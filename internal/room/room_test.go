package room

import "testing"

func TestExpected(t *testing.T) {
	cases := []struct {
		name             string
		rate, horizon, z float64
		want             float64
	}{
		{"idle sites keep nothing", 0, 300, 2, 0},
		{"expected spend with no margin", 0.01, 300, 0, 3},
		{"poisson margin", 0.01, 400, 2, 4 + 2*2},
		{"negative horizon", 1, -300, 2, 0},
		{"negative z is none", 0.01, 300, -1, 3},
	}
	for _, c := range cases {
		if got := Expected(c.rate, c.horizon, c.z); got != c.want {
			t.Errorf("%s: Expected(%v, %v, %v) = %v, want %v", c.name, c.rate, c.horizon, c.z, got, c.want)
		}
	}
}
