/*
 * one_instance_engine -- a native env engine that allows one instance per process, as some simulators shipped
 * as DLLs do: its state lives in the library's globals, and a second engine_create() in the same process fails
 * until engine_destroy(). Built as a Windows DLL (mingw-w64) or a Linux shared object (gcc) by
 * tests/native_engine/engine.py, and stepped through ctypes.
 *
 * The dynamics are a deterministic function of the seed and the actions: a 64-bit linear congruential
 * generator drives four float observations; the episode ends when |obs[0]| passes 4 or after 200 steps.
 */
#include <stdint.h>
#include <string.h>

#ifdef _WIN32
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

#define OBS_SIZE 4
#define MAX_STEPS 200

static int alive = 0;
static uint64_t rng = 0;
static int steps = 0;
static float state[OBS_SIZE];

static float next_uniform(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) & 0xFFFFFF) / (float)0x1000000;  /* [0, 1) from the top 24 bits */
}

/* 0 on success; -1 when this process already has an engine */
EXPORT int engine_create(void)
{
    if (alive) {
        return -1;
    }
    alive = 1;
    steps = 0;
    memset(state, 0, sizeof(state));
    return 0;
}

EXPORT void engine_destroy(void)
{
    alive = 0;
}

EXPORT int engine_alive(void)
{
    return alive;
}

/* seeds the engine and writes the first observation; -1 without an engine */
EXPORT int engine_reset(uint64_t seed, float *obs)
{
    if (!alive) {
        return -1;
    }
    rng = seed ^ 0x9E3779B97F4A7C15ULL;
    steps = 0;
    for (int i = 0; i < OBS_SIZE; i++) {
        state[i] = next_uniform() - 0.5f;
    }
    memcpy(obs, state, sizeof(state));
    return 0;
}

/* action in {0, 1, 2}; writes the observation and reward; returns 1 when terminated, 2 when truncated, 0 when
   the episode goes on, -1 without an engine or for a bad action */
EXPORT int engine_step(int action, float *obs, float *reward)
{
    if (!alive || action < 0 || action > 2) {
        return -1;
    }
    float push = (float)(action - 1) * 0.25f;
    for (int i = 0; i < OBS_SIZE; i++) {
        state[i] += push * (float)(i + 1) + 0.5f * (next_uniform() - 0.5f);
    }
    steps++;
    memcpy(obs, state, sizeof(state));
    *reward = 1.0f - 0.1f * (state[0] < 0 ? -state[0] : state[0]);
    if (state[0] > 4.0f || state[0] < -4.0f) {
        return 1;
    }
    return steps >= MAX_STEPS ? 2 : 0;
}
