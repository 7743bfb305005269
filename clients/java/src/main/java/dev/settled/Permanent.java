package dev.settled;

/** Throw from a handler: the settlement failed for good; the receipt is dead-lettered. */
public class Permanent extends RuntimeException {
    private final FailureCode code;
    private final String detail;
    private final String railCode;

    public Permanent(FailureCode code, String detail) {
        this(code, detail, null);
    }

    public Permanent(FailureCode code, String detail, String railCode) {
        super(detail != null ? detail : String.valueOf(code));
        Outcome.permanent(code, detail, railCode);
        this.code = code;
        this.detail = detail;
        this.railCode = railCode;
    }

    public FailureCode code() { return code; }
    public String detail() { return detail; }
    public String railCode() { return railCode; }

    Outcome outcome() { return Outcome.permanent(code, detail, railCode); }
}
