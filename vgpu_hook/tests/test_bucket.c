/*
 * test_bucket.c - proves the compute limiter's arithmetic without a GPU:
 *  1. launch cost is the thread count, saturates instead of overflowing, never 0;
 *  2. with rate 0 (unknown) every launch passes but is counted;
 *  3. over simulated time the bucket admits rate * seconds of cost (+ one burst), and makes a
 *     caller wait exactly the debt / rate;
 *  4. the controller drives a simulated GPU (util = gain * admitted cost rate, saturating at
 *     100, with noise) to 10/30/50/70 % with mean absolute error <= 1 point after settling;
 *  5. it re-converges when the kernel mix changes (gain steps by 3x);
 *  6. an application that wants less than its cap builds no credit (anti-windup);
 *  6b. a gain learnt 100x too high (launches starved below NVML's resolution) recovers;
 *  7. the balance policy borrows idle capacity and shrinks back to the cap under contention;
 *  8. a launch the credit covers needs no clock (charge alone says "go"), the refill is lazy and
 *     still admits exactly rate * time, and idle time never banks more than one burst;
 *  9. the step that first learns the gain does not integrate (a claim seeded under its cap
 *     does not overshoot at the next step), and the sample after a big rate change is skipped
 *     unless its window was aligned with NVML's sample period;
 * 10. the in-process fallback's poll (vgpu_ctl_poll, a scripted NVML): a first sample that
 *     covered most of its period is learnt from, one that covered little only anchors; a
 *     window ends midway between the polls that bracket the period's end, its cost
 *     interpolated; polls stay fast while learning and for the first steps after.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "vgpu.h"

static void test_cost(void) {
    CHECK_EQ_U64(vgpu_launch_cost(1, 1, 1, 1, 1, 1), 1);
    CHECK_EQ_U64(vgpu_launch_cost(0, 0, 0, 0, 0, 0), 1);
    CHECK_EQ_U64(vgpu_launch_cost(10, 2, 1, 256, 1, 1), 5120);
    CHECK(vgpu_launch_cost(0xffffffffu, 0xffffffffu, 0xffffffffu, 1024, 1024, 64) == 1ULL << 48);
}

static void test_unknown_rate(void) {
    struct vgpu_region_device d;
    memset(&d, 0, sizeof d);
    for (int i = 0; i < 100; i++) CHECK_EQ_U64(vgpu_bucket_take(&d, 1000, (uint64_t)i), 0);
    CHECK_EQ_U64(d.launches, 100);
    CHECK_EQ_U64(d.launch_cost, 100000);
}

static void test_bucket_rate(void) {
    struct vgpu_region_device d;
    memset(&d, 0, sizeof d);
    atomic_store(&d.rate, 100000); /* cost units per second */
    uint64_t now = 1000000000ULL, admitted = 0;
    /* A greedy caller: launches cost 1000 whenever allowed, sleeps when told to. */
    uint64_t end = now + 2000000000ULL;
    while (now < end) {
        uint64_t wait = vgpu_bucket_take(&d, 1000, now);
        admitted += 1000;
        now += wait ? wait : 1000; /* 1 us per launch when not throttled */
    }
    /* 2 s at 100000/s = 200000, plus at most one burst (20 ms = 2000) and one launch. */
    CHECK(admitted >= 198000 && admitted <= 204000);
    /* The wait equals the debt divided by the rate. */
    struct vgpu_region_device e;
    memset(&e, 0, sizeof e);
    atomic_store(&e.rate, 1000);
    CHECK_EQ_U64(vgpu_bucket_take(&e, 1, 5), 0 + 1000001); /* tokens start at 0: 1 unit debt */
}

struct plant {
    double gain;   /* true util points per cost unit/s */
    double demand; /* cost units/s the app would launch unthrottled */
    unsigned seed;
};

static double noise(struct plant *p) {
    p->seed = p->seed * 1103515245u + 12345u;
    return ((double)((p->seed >> 16) & 0x7fff) / 32767.0 - 0.5) * 2.0; /* +-1 point */
}

/* Run `steps` controller periods; returns the mean absolute error over the last `measure`. */
static double run_plant(struct plant *p, struct vgpu_ctl_state *st, double target, int steps,
                        int measure, double *rate) {
    double err_sum = 0;
    for (int i = 0; i < steps; i++) {
        double admitted = *rate > 0 && *rate < p->demand ? *rate : p->demand;
        double util = p->gain * admitted;
        if (util > 100) util = 100;
        double measured = util + noise(p);
        if (measured < 0) measured = 0;
        if (i >= steps - measure) err_sum += fabs(util - target);
        struct vgpu_ctl_sample s = {.target = target, .util = measured,
                                    .cost_rate = admitted, .dt = 0.1,
                                    .throttled = *rate > 0 && *rate < p->demand};
        *rate = vgpu_ctl_step(st, &s, *rate);
    }
    return err_sum / measure;
}

static void test_controller_accuracy(void) {
    const double targets[] = {10, 30, 50, 70};
    for (int t = 0; t < 4; t++) {
        struct plant p = {.gain = 0.001, .demand = 1e6, .seed = 7u + (unsigned)t};
        struct vgpu_ctl_state st = {0};
        double rate = 0;
        double mae = run_plant(&p, &st, targets[t], 80, 50, &rate);
        printf("target %.0f: mean abs error %.2f points\n", targets[t], mae);
        CHECK(mae <= 1.0);
    }
}

static void test_controller_reconverges(void) {
    struct plant p = {.gain = 0.001, .demand = 1e6, .seed = 3};
    struct vgpu_ctl_state st = {0};
    double rate = 0;
    CHECK(run_plant(&p, &st, 30, 60, 30, &rate) <= 1.0);
    p.gain *= 3; /* kernels got 3x heavier per thread */
    CHECK(run_plant(&p, &st, 30, 80, 40, &rate) <= 1.0);
}

static void test_anti_windup(void) {
    /* App wants 20 points (demand 20000 * 0.001) while capped at 50: no credit builds up. */
    struct plant p = {.gain = 0.001, .demand = 20000, .seed = 5};
    struct vgpu_ctl_state st = {0};
    double rate = 0;
    run_plant(&p, &st, 50, 100, 10, &rate);
    CHECK(st.integral <= 0.5);
    /* When it suddenly wants everything, the overshoot is bounded and it settles. */
    p.demand = 1e6;
    double first = 0.001 * (rate < p.demand ? rate : p.demand);
    CHECK(first <= 60);
    CHECK(run_plant(&p, &st, 50, 60, 30, &rate) <= 1.0);
}

static void test_recovers_from_bad_gain(void) {
    struct plant p = {.gain = 0.001, .demand = 1e6, .seed = 9};
    struct vgpu_ctl_state st = {.gain = 0.1, .integral = 0};
    double rate = 100; /* util 0.1 % : invisible to NVML */
    CHECK(run_plant(&p, &st, 10, 120, 40, &rate) <= 1.0);
}

static void test_balance(void) {
    CHECK(fabs(vgpu_balance_target(30, 90, 90) - 95) < 1e-9);  /* alone: borrow idle SMs */
    CHECK(fabs(vgpu_balance_target(30, 32, 30) - 40) < 1e-9);  /* ...10 points per step */
    CHECK(fabs(vgpu_balance_target(30, 100, 30) - 30) < 1e-9); /* others use 70: own cap */
    CHECK(fabs(vgpu_balance_target(30, 80, 40) - 50) < 1e-9);  /* others use 40: up to 55 */
    CHECK(fabs(vgpu_balance_target(30, 10, 90) - 95) < 1e-9);  /* noisy samples: no negatives */
    /* Borrowing (own 80 over cap 30) on a full GPU: step back 10 points for the others. */
    CHECK(fabs(vgpu_balance_target(30, 99, 80) - 70) < 1e-9);
    CHECK(fabs(vgpu_balance_target(30, 99, 35) - 30) < 1e-9);  /* never under the cap */
    CHECK(fabs(vgpu_balance_target(30, 99, 99) - 95) < 1e-9); /* alone: no one to yield to */
}

static void test_lazy_refill(void) {
    struct vgpu_region_device d;
    memset(&d, 0, sizeof d);
    atomic_store(&d.rate, 1000000); /* 1e6 units/s */
    uint64_t now = 1000000000ULL;
    CHECK(vgpu_bucket_take(&d, 100, now) > 0); /* starts empty: 100 units of debt */
    now += 1000000;                            /* 1 ms later: 1000 units earned */
    CHECK_EQ_U64(vgpu_bucket_take(&d, 100, now), 0);
    bool covered = false;
    /* 800 more units are covered by what that refill credited, without any clock. */
    for (int i = 0; i < 8; i++) {
        vgpu_bucket_charge(&d, 100, &covered);
        CHECK(covered);
    }
    uint64_t spent = vgpu_bucket_charge(&d, 100, &covered);
    CHECK(!covered);
    CHECK_EQ_U64(vgpu_bucket_settle(&d, spent, 100, now), 100000 + 1); /* 100 units at 1e6/s */
    /* Idle for 10 s: at most one burst (20 ms = 20000 units, + one launch) is banked. */
    now += 10000000000ULL;
    uint64_t admitted = 0;
    while (vgpu_bucket_take(&d, 100, now) == 0) admitted += 100;
    CHECK(admitted >= 19900 && admitted <= 20200);
}

static void test_learning_step_does_not_integrate(void) {
    /* Seeded at a rate giving 5 % while capped at 30: the first step learns the gain only. */
    struct vgpu_ctl_state st = {0};
    struct vgpu_ctl_sample s = {.target = 30, .util = 5, .cost_rate = 5e6, .dt = 0.1,
                                .throttled = true};
    double rate = vgpu_ctl_step(&st, &s, 5e6);
    CHECK(fabs(st.integral) < 1e-12);
    CHECK(fabs(rate - 30e6) < 1); /* exactly the cap over the learnt gain: no overshoot */
    /* That step moved the rate a lot: the next sample (its period may mix both rates) is
     * skipped, the rate held; later steps integrate again. */
    CHECK(st.hold);
    s.util = 12;
    s.cost_rate = rate;
    CHECK(vgpu_ctl_step(&st, &s, rate) == rate);
    CHECK(!st.hold && fabs(st.integral) < 1e-12);
    /* A window at 29 % is far more precise than the 5 % one the gain was learnt from: it
     * replaces the gain (no integration on that step either), and steps after it integrate. */
    s.util = 29;
    vgpu_ctl_step(&st, &s, rate);
    CHECK(fabs(st.integral) < 1e-12);
    vgpu_ctl_step(&st, &s, rate);
    CHECK(st.integral > 0);
}

static void test_precise_window_replaces_seed_gain(void) {
    /* True gain 7.2e-8: the seed window (3e7 units/s, 2.16 % truly) reads 2 %, so the learnt
     * gain is 7 % low and the first budget overshoots the cap of 30 to 32.4 %. The next window
     * (after the skipped straddling one) reads 32 %, 16x the seed's precision: the gain moves
     * nearly all the way (a plain 0.4 EMA would leave 60 % of the error). */
    const double truth = 7.2e-8;
    struct vgpu_ctl_state st = {0};
    struct vgpu_ctl_sample s = {.target = 30, .util = 2, .cost_rate = 3e7, .dt = 0.17,
                                .throttled = true};
    double rate = vgpu_ctl_step(&st, &s, 3e7);
    CHECK(st.hold);
    s.cost_rate = rate;
    s.util = 31; /* the straddling window: skipped */
    CHECK(vgpu_ctl_step(&st, &s, rate) == rate);
    s.util = round(truth * rate);
    rate = vgpu_ctl_step(&st, &s, rate);
    CHECK(fabs(st.gain - truth) / truth < 0.02);
    CHECK(fabs(truth * rate - 30) < 0.6);
    /* In steady state windows are equally precise and the estimate is the plain EMA. */
    for (int i = 0; i < 20; i++) {
        s.cost_rate = rate;
        s.util = 30;
        rate = vgpu_ctl_step(&st, &s, rate);
    }
    double before = st.gain;
    /* Same utilisation for more launches: lighter kernels (a spent share of the budget within
     * VGPU_SPENT_CHANGE of the last window's: a steady window, not a resume). */
    s.cost_rate = rate * 1.1;
    vgpu_ctl_step(&st, &s, rate);
    double moved = (st.gain - before) / (30 / s.cost_rate - before);
    CHECK(fabs(moved - (1.0 - VGPU_GAIN_MEMORY)) < 0.05);
}

static void test_a_pause_or_a_resume_teaches_nothing(void) {
    /* A settled claim pauses: the window's cost rate falls to a fifth of its budget while the
     * sample's period covered the launches before the pause (it reads 30 %). Learnt from, the
     * gain would come out 5x high; instead the window and the next are skipped, rate kept. */
    const double truth = 7.2e-8;
    struct vgpu_ctl_state st = {.gain = truth, .weight = 2250};
    double rate = 30 / truth;
    struct vgpu_ctl_sample s = {.target = 30, .util = 30, .cost_rate = rate, .dt = 0.1,
                                .throttled = true};
    rate = vgpu_ctl_step(&st, &s, rate);
    CHECK(fabs(st.spent - 1.0) < 1e-9);
    s.cost_rate = rate / 5;
    CHECK(vgpu_ctl_step(&st, &s, rate) == rate);
    CHECK(st.gain == truth && st.hold);
    s.util = 5; /* the next period straddles the resume: skipped too */
    s.cost_rate = rate;
    CHECK(vgpu_ctl_step(&st, &s, rate) == rate);
    CHECK(st.gain == truth && !st.hold);
    /* Back to a steady window (the same share as the last): learnt from again. */
    s.util = 31;
    double next = vgpu_ctl_step(&st, &s, rate);
    CHECK(st.gain > truth && next < rate);
    /* Within VGPU_SPENT_CHANGE of the last window's share, a window is steady. */
    s.util = 30;
    s.cost_rate = next * (1 - VGPU_SPENT_CHANGE / 2);
    double gain = st.gain;
    vgpu_ctl_step(&st, &s, next);
    CHECK(st.gain != gain && !st.hold);
}

static void test_aligned_window_is_not_held(void) {
    /* The same big move as above, but the window ended within a learning poll of the period's
     * end: the next period, straddling the change, is measured as it was, so it is used. */
    struct vgpu_ctl_state st = {0};
    struct vgpu_ctl_sample s = {.target = 30, .util = 2, .cost_rate = 3e7, .dt = 0.17,
                                .throttled = true, .aligned = true};
    double rate = vgpu_ctl_step(&st, &s, 3e7);
    CHECK(!st.hold);
    s.cost_rate = rate;
    s.util = 33;
    CHECK(vgpu_ctl_step(&st, &s, rate) < rate); /* acted on: over target, the rate drops */
}

static void test_reading_below_resolution_never_raises_the_gain(void) {
    /* Learnt at 1.5e-7 (cap 30 at 2e8 units/s). A window in which the claim hardly launched
     * (1e5 units/s: 0.015 % predicted) reads 0 or 1 %: both fit a gain from 0 to 100x the one
     * learnt, so the gain stays (it used to jump 0.4 of the way to 0.25 / 1e5 = 17x, and the
     * claim ran at 1/10 of its cap until the EMA unwound it). */
    const double gain = 1.5e-7;
    for (int reading = 0; reading <= 1; reading++) {
        struct vgpu_ctl_state st = {.gain = gain, .weight = 900};
        struct vgpu_ctl_sample s = {.target = 30, .util = reading, .cost_rate = 1e5, .dt = 0.1};
        double rate = vgpu_ctl_step(&st, &s, 2e8);
        CHECK(st.gain <= gain);
        CHECK(rate >= 2e8 * 0.99);
    }
    /* Nor lowered by a window in which the claim spent under half its budget: back from an
     * idle moment, its launches are measured against a sample period that ended before them. */
    struct vgpu_ctl_state back = {.gain = gain, .weight = 900};
    struct vgpu_ctl_sample resumed = {.target = 30, .util = 0, .cost_rate = 5e7, .dt = 0.1};
    vgpu_ctl_step(&back, &resumed, 2e8);
    CHECK(back.gain == gain);
    /* A claim starved by a gain learnt 100x too high still unwinds: 0 % over what its rate
     * admits lowers the gain to at most the top of the reading's rounding interval, 0.4 of
     * the way per step (each big move skips the next sample: about twenty steps). */
    struct vgpu_ctl_state st = {.gain = 100 * gain, .weight = 900};
    double rate = 30 / st.gain;
    int steps = 0;
    while (gain * rate < 27 && steps < 100) {
        struct vgpu_ctl_sample s = {.target = 30, .util = round(gain * rate), .dt = 0.1,
                                    .cost_rate = rate, .throttled = true};
        rate = vgpu_ctl_step(&st, &s, rate);
        steps++;
    }
    CHECK(steps <= 20);
    CHECK(st.gain < 2 * gain);
    /* ... without winding the integral up meanwhile: the claim does not overshoot after. */
    double peak = 0;
    for (int i = 0; i < 20; i++) {
        struct vgpu_ctl_sample s = {.target = 30, .util = round(gain * rate), .dt = 0.1,
                                    .cost_rate = rate, .throttled = true};
        rate = vgpu_ctl_step(&st, &s, rate);
        if (gain * rate > peak) peak = gain * rate;
    }
    CHECK(peak < 33);
}

static void test_short_window_does_not_relearn_the_gain(void) {
    /* Learnt; a 10 ms window carrying an old period's 5 % at the new rate (a sample answered
     * twice) leaves the gain alone, a 0.1 s one moves it. */
    struct vgpu_ctl_state st = {.gain = 1.66e-7, .weight = 30};
    struct vgpu_ctl_sample s = {.target = 30, .util = 5, .cost_rate = 1.3e8, .dt = 0.01,
                                .throttled = true};
    vgpu_ctl_step(&st, &s, 1.8e8);
    CHECK(st.gain == 1.66e-7);
    s.dt = 0.1;
    vgpu_ctl_step(&st, &s, 1.8e8);
    CHECK(st.gain < 1.66e-7);
}

/* A scripted NVML for vgpu_ctl_poll: "nothing new" until `fresh_from`, then `util` points. */
struct script {
    uint64_t fresh_from;
    double util;
    uint64_t now;
    int calls;
};

static enum vgpu_sample_result scripted(void *ctx, uint64_t age_ns, double *device_util,
                                        double *claim_util) {
    struct script *sc = ctx;
    sc->calls++;
    CHECK(age_ns > 0);
    if (sc->now < sc->fresh_from) return VGPU_SAMPLE_NOTHING_NEW;
    sc->fresh_from = sc->now + 166667000ULL; /* the next period end */
    *device_util = *claim_util = sc->util;
    return VGPU_SAMPLE_OK;
}

#define MS 1000000ULL

/* A claim seeded at `seed_rate` at t0, launching exactly at that rate, polled every 10 ms
 * until the first fresh sample at `fresh_at`; returns the rate then. */
static uint64_t first_sample_after(uint64_t fresh_at, double util, struct vgpu_region_device *d) {
    const uint64_t t0 = 1000 * MS, seed_rate = 30000000;
    memset(d, 0, sizeof *d);
    d->rate = seed_rate;
    d->rate_stamp_ns = t0;
    d->rate_source = VGPU_RATE_SEED;
    struct script sc = {.fresh_from = fresh_at, .util = util};
    for (uint64_t t = t0; t <= fresh_at + 9 * MS; t += 10 * MS) {
        d->launch_cost = (t - t0) * seed_rate / 1000000000ULL;
        sc.now = t;
        if (vgpu_ctl_poll(d, 30, VGPU_POLICY_FIXED, t, scripted, &sc)) break;
    }
    CHECK(sc.calls > 0);
    return d->rate;
}

static void test_poll_learns_from_a_well_covered_first_sample(void) {
    struct vgpu_region_device d;
    /* The period ended 150 ms after the first launch (90 % of 1/6 s): learnt from at once,
     * its 2 points taken as 2.5 (the top of the rounding interval), over the whole period. */
    uint64_t rate = first_sample_after(1000 * MS + 155 * MS, 2, &d);
    CHECK(d.rate_source == VGPU_RATE_HOOK);
    double gain = vgpu_bits_to_double(d.ctl_gain_bits);
    double cost_rate = (double)d.ctl_cost_mark / (166667000.0 / 1e9);
    CHECK(fabs(gain - 2.5 / cost_rate) / gain < 1e-9);
    CHECK(fabs((double)rate - 30 / gain) <= 1);
    /* The window ended midway between the last poll without a sample and this one, the cost
     * interpolated there; an aligned window sets no hold, and polls stay fast. */
    CHECK_EQ_U64(d.ctl_window_ns, 1000 * MS + 155 * MS);
    CHECK_EQ_U64(d.ctl_cost_mark, 155 * MS * 30000000ULL / 1000000000ULL);
    CHECK(d.ctl_hold == 0 && d.ctl_moved == 1 && d.ctl_steps == 1);
    CHECK(!vgpu_ctl_poll(&d, 30, VGPU_POLICY_FIXED, 1000 * MS + 165 * MS + 9 * MS, scripted,
                         &(struct script){.fresh_from = UINT64_MAX}));
    CHECK_EQ_U64(d.ctl_stamp_ns, 1000 * MS + 174 * MS); /* polled again 14 ms later... */
    /* ...but not 9 ms after that: the period is 10 ms (not 100) while the rate just moved. */
    CHECK(!vgpu_ctl_poll(&d, 30, VGPU_POLICY_FIXED, 1000 * MS + 183 * MS, scripted,
                         &(struct script){.fresh_from = UINT64_MAX}));
    CHECK_EQ_U64(d.ctl_stamp_ns, 1000 * MS + 174 * MS);
}

static void test_poll_waits_the_full_period_after_two_fresh_polls(void) {
    /* A sampler fresh at every poll (answering for the caller's own interval, as the
     * simulator's exact mode does): fast polls would only make 10 ms windows. */
    struct vgpu_region_device d;
    (void)first_sample_after(1000 * MS + 155 * MS, 2, &d); /* learnt at 160 ms, moved */
    struct script always = {.fresh_from = 0, .util = 30};
    always.now = 1000 * MS + 170 * MS;
    CHECK(vgpu_ctl_poll(&d, 30, VGPU_POLICY_FIXED, always.now, scripted, &always));
    CHECK_EQ_U64(d.ctl_poll_fresh, 2);
    /* Two fresh polls in a row: not 10 ms later, but 100 ms later. */
    always.fresh_from = 0;
    always.now = 1000 * MS + 180 * MS;
    CHECK(!vgpu_ctl_poll(&d, 30, VGPU_POLICY_FIXED, always.now, scripted, &always));
    CHECK_EQ_U64(d.ctl_stamp_ns, 1000 * MS + 170 * MS);
    always.fresh_from = 0;
    always.now = 1000 * MS + 270 * MS;
    CHECK(vgpu_ctl_poll(&d, 30, VGPU_POLICY_FIXED, always.now, scripted, &always));
    CHECK_EQ_U64(d.ctl_stamp_ns, 1000 * MS + 270 * MS);
    /* A poll that finds nothing new resets the streak: the next one is fast again. */
    struct script none = {.fresh_from = UINT64_MAX};
    CHECK(!vgpu_ctl_poll(&d, 30, VGPU_POLICY_FIXED, 1000 * MS + 370 * MS, scripted, &none));
    CHECK_EQ_U64(d.ctl_poll_fresh, 0);
}

static void test_poll_anchors_on_a_barely_covered_first_sample(void) {
    struct vgpu_region_device d;
    /* The period ended 45 ms after the first launch (27 % of it): the sample only anchors. */
    uint64_t rate = first_sample_after(1000 * MS + 45 * MS, 1, &d);
    CHECK_EQ_U64(rate, 30000000);
    CHECK(d.rate_source == VGPU_RATE_SEED && d.ctl_gain_bits == 0 && d.ctl_steps == 0);
    CHECK_EQ_U64(d.ctl_window_ns, 1000 * MS + 45 * MS);
    /* Reading nothing (under a point) anchors too, however long the claim ran. */
    rate = first_sample_after(1000 * MS + 155 * MS, 0, &d);
    CHECK_EQ_U64(rate, 30000000);
    CHECK(d.ctl_gain_bits == 0);
}

int main(void) {
    test_cost();
    test_unknown_rate();
    test_bucket_rate();
    test_controller_accuracy();
    test_controller_reconverges();
    test_anti_windup();
    test_recovers_from_bad_gain();
    test_balance();
    test_lazy_refill();
    test_learning_step_does_not_integrate();
    test_precise_window_replaces_seed_gain();
    test_a_pause_or_a_resume_teaches_nothing();
    test_aligned_window_is_not_held();
    test_reading_below_resolution_never_raises_the_gain();
    test_short_window_does_not_relearn_the_gain();
    test_poll_learns_from_a_well_covered_first_sample();
    test_poll_waits_the_full_period_after_two_fresh_polls();
    test_poll_anchors_on_a_barely_covered_first_sample();
    CHECK_DONE();
}
