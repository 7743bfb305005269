package dev.settled;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

class OutcomeTest {
    static String json(Object o) throws Exception {
        return Client.JSON.writeValueAsString(o);
    }

    @Test
    void outcomesSerializeAsTheSpecSays() throws Exception {
        assertEquals("{\"kind\":\"accepted\",\"transcript_id\":\"tx-1\"}", json(Outcome.accepted("tx-1")));
        assertEquals("{\"kind\":\"skipped\",\"reason\":\"zero_charge\"}", json(new Skip(SkipReason.ZERO_CHARGE).reason() == SkipReason.ZERO_CHARGE ? Outcome.skipped(SkipReason.ZERO_CHARGE) : null));
        assertEquals("{\"kind\":\"retryable\",\"code\":\"rpc\",\"detail\":\"slow\",\"retry_after_ms\":3000,\"rail_code\":\"rate_limited\"}",
                json(new Retryable(FailureCode.RPC, "slow", 3000L, "rate_limited").outcome()));
        assertEquals("{\"kind\":\"permanent\",\"code\":\"verification\",\"rail_code\":\"card_declined\"}",
                json(new Permanent(FailureCode.VERIFICATION, null, "card_declined").outcome()));
    }

    @Test
    void outcomesOutsideTheSpecAreRefusedWhenMade() {
        assertThrows(InvalidOutcomeException.class, () -> new Retryable(null, "no code"));
        assertThrows(InvalidOutcomeException.class, () -> new Permanent(FailureCode.VERIFICATION, "d", "card declined!"));
        assertThrows(InvalidOutcomeException.class, () -> new Permanent(FailureCode.VERIFICATION, "d", "x".repeat(65)));
        assertThrows(InvalidOutcomeException.class, () -> new Retryable(FailureCode.RPC, "d", -1L, null));
        assertThrows(InvalidOutcomeException.class, () -> new Skip(null));
        assertThrows(InvalidOutcomeException.class, () -> Outcome.check(new Outcome.Permanent("permanent", null, null, null)));
    }

    @Test
    void theDefaultErrorOutcomeIsRetryable() {
        Outcome.Retryable unexpected = (Outcome.Retryable) Worker.defaultErrorOutcome(new IllegalStateException("boom"), null);
        assertEquals(FailureCode.RPC, unexpected.code());
        assertEquals("IllegalStateException: boom", unexpected.detail());
        Outcome.Retryable refused = (Outcome.Retryable) Worker.defaultErrorOutcome(
                new OutcomeRefusedException(422, "invalid_transcript_id", "too long", Outcome.accepted("x")), null);
        assertEquals(FailureCode.BACKEND, refused.code());
        Outcome.Retryable huge = (Outcome.Retryable) Worker.defaultErrorOutcome(new RuntimeException("x".repeat(5000)), null);
        assertEquals(1000, huge.detail().length());
    }

    @Test
    void lookAgainIsNeverSleptPastTheWaitFromSeveralGroups() {
        Client c = Client.builder("http://127.0.0.1:1").build();
        Worker all = Worker.builder(c).workerId("w").handler(j -> null).waitMs(5000).build();
        assertEquals(0, all.pauseAfterEmpty(60_000L, 5000), "a long poll already waited");
        assertEquals(250, all.pauseAfterEmpty(60_000L, 10), "a quick empty answer: a short pause");
        Worker one = Worker.builder(c).workerId("w").handler(j -> null).groups(java.util.List.of("rail:ach")).build();
        assertEquals(60_000, one.pauseAfterEmpty(60_000L, 5000), "one group: nothing more before then");
        assertEquals(86_400_000, one.pauseAfterEmpty(Long.MAX_VALUE, 5000));
    }
}
