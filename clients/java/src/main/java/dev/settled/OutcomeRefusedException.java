package dev.settled;

/** The server refused the outcome reported for a job (a 422 such as invalid_transcript_id): handed to onError. */
public class OutcomeRefusedException extends SettledException {
    private final int status;
    private final String code;
    private final String detail;
    private final Outcome outcome;

    public OutcomeRefusedException(int status, String code, String detail, Outcome outcome) {
        super(status + " " + code + ": " + detail);
        this.status = status;
        this.code = code;
        this.detail = detail;
        this.outcome = outcome;
    }

    public int status() { return status; }
    public String code() { return code; }
    public String detail() { return detail; }
    /** The outcome that was refused. */
    public Outcome outcome() { return outcome; }
}
