package dev.settled;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.annotation.JsonProperty;
import java.io.IOException;
import java.lang.reflect.RecordComponent;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/**
 * The Java types follow openapi.yaml: each record has the properties of its schema, the same
 * ones required; each enum has the schema's values. Fails when the spec changes and they do not.
 */
class TypesMatchSpecTest {
    /** A schema of components.schemas: its properties, required ones and enum values. */
    record Schema(Set<String> properties, Set<String> required, List<String> values) {}

    /**
     * The schemas of openapi.yaml, read by indentation: the spec is generated, with schemas at
     * four spaces, their keys at six and property names at eight.
     */
    static Map<String, Schema> schemas() throws IOException {
        Path spec = Path.of(System.getProperty("settled.openapi", "../../openapi.yaml"));
        List<String> lines = Files.readAllLines(spec);
        Map<String, Schema> out = new LinkedHashMap<>();
        int i = lines.indexOf("  schemas:");
        assertTrue(i > 0, "no components.schemas in " + spec);
        String name = null;
        String section = null;
        Schema current = null;
        for (i++; i < lines.size(); i++) {
            String line = lines.get(i);
            if (line.isBlank()) continue;
            int indent = line.length() - line.stripLeading().length();
            if (indent < 4) break;
            String text = line.strip();
            if (indent == 4 && text.endsWith(":")) {
                name = text.substring(0, text.length() - 1);
                current = new Schema(new TreeSet<>(), new TreeSet<>(), new ArrayList<>());
                out.put(name, current);
                section = null;
            } else if (current == null) {
                continue;
            } else if (indent == 6 && text.startsWith("- ")) {
                // `required:` and `enum:` lists sit at the same indent as their key.
                String item = text.substring(2).replaceAll("^'(.*)'$", "$1");
                if ("required".equals(section)) current.required().add(item);
                else if ("enum".equals(section)) current.values().add(item);
            } else if (indent == 6) {
                section = text.endsWith(":") ? text.substring(0, text.length() - 1) : null;
            } else if (indent == 8 && "properties".equals(section) && text.endsWith(":")) {
                current.properties().add(text.substring(0, text.length() - 1));
            }
        }
        return out;
    }

    static final Map<Class<? extends Record>, String> RECORDS = new LinkedHashMap<>();

    static {
        RECORDS.put(Types.Claim.class, "Claim");
        RECORDS.put(Types.ClaimsIn.class, "ClaimsIn");
        RECORDS.put(Types.ClaimOneIn.class, "ClaimOneIn");
        RECORDS.put(Types.ClaimsOut.class, "ClaimsOut");
        RECORDS.put(Types.ReceiptIn.class, "ReceiptIn");
        RECORDS.put(Types.LeaseExtendIn.class, "LeaseExtendIn");
        RECORDS.put(Types.LeaseReleaseIn.class, "LeaseReleaseIn");
        RECORDS.put(Types.OutcomeRequest.class, "OutcomeRequest");
        RECORDS.put(Types.LeaseExtendResult.class, "LeaseExtendResult");
        RECORDS.put(Types.OutcomeResult.class, "OutcomeResult");
        RECORDS.put(Types.Problem.class, "Problem");
        RECORDS.put(Outcome.Accepted.class, "AcceptedOutcome");
        RECORDS.put(Outcome.Skipped.class, "SkippedOutcome");
        RECORDS.put(Outcome.Retryable.class, "RetryableOutcome");
        RECORDS.put(Outcome.Permanent.class, "PermanentOutcome");
    }

    @Test
    void recordsHaveTheSpecsPropertiesAndRequiredFields() throws IOException {
        Map<String, Schema> spec = schemas();
        List<String> drift = new ArrayList<>();
        for (Map.Entry<Class<? extends Record>, String> e : RECORDS.entrySet()) {
            Schema s = spec.get(e.getValue());
            if (s == null) {
                drift.add(e.getValue() + ": no longer in openapi.yaml");
                continue;
            }
            Set<String> names = new TreeSet<>();
            Set<String> required = new TreeSet<>();
            for (RecordComponent c : e.getKey().getRecordComponents()) {
                JsonProperty p = c.getAccessor().getAnnotation(JsonProperty.class);
                if (p == null) p = c.getAnnotation(JsonProperty.class);
                if (p == null) {
                    try {
                        p = e.getKey().getDeclaredField(c.getName()).getAnnotation(JsonProperty.class);
                    } catch (NoSuchFieldException ignored) {
                        // Below.
                    }
                }
                String n = p != null && !p.value().isEmpty() ? p.value() : c.getName();
                names.add(n);
                if (p != null && p.required()) required.add(n);
            }
            if (!names.equals(s.properties())) drift.add(e.getValue() + " properties: spec " + s.properties() + ", Java " + names);
            if (!required.equals(s.required())) drift.add(e.getValue() + " required: spec " + s.required() + ", Java " + required);
        }
        assertTrue(drift.isEmpty(), "the Java types do not follow openapi.yaml:\n  " + String.join("\n  ", drift));
    }

    static List<String> wire(Enum<?>[] values) {
        return Arrays.stream(values).map(Object::toString).filter(v -> !v.isEmpty()).collect(Collectors.toList());
    }

    @Test
    void enumsHaveTheSpecsValues() throws IOException {
        Map<String, Schema> spec = schemas();
        assertEquals(spec.get("SettlementFailureCode").values(), wire(FailureCode.values()), "FailureCode vs SettlementFailureCode");
        assertEquals(spec.get("SettlementSkipReason").values(), wire(SkipReason.values()), "SkipReason vs SettlementSkipReason");
        assertEquals(spec.get("ProblemCode").values(), wire(ProblemCode.values()), "ProblemCode vs ProblemCode");
        assertEquals(spec.get("ProblemClass").values(), wire(ProblemClass.values()), "ProblemClass vs ProblemClass");
        assertTrue(spec.get("ProblemCode").values().size() > 40, "the spec reader found the problem codes");
    }
}
